#!/usr/bin/env bash
# A rank's wrapper that has its trainer started by a service outside its own process tree
# (tests/trainer_service.py: SPOOL), shows the trainer's log as its own output, and ends with the
# trainer's exit code once it ends. Usage: service_wrapper.sh SPOOL COMMAND...
set -u
spool=$1; shift
stem=$(mktemp -u "$spool/trainer-XXXXXXXX")
: > "$stem.log"
python3 -c 'import json, os, sys; json.dump({"argv": sys.argv[3:], "cwd": os.getcwd(), "log": sys.argv[2]}, open(sys.argv[1], "w"))' \
  "$stem.tmp" "$stem.log" "$@"
mv "$stem.tmp" "$stem.json"
# The log shown until the trainer's exit code is there (written once the trainer has ended, so its
# log is whole): tail reads the file a last time once the waiter it watches has ended.
(until [ -s "$stem.rc" ]; do sleep 0.05; done) &
tail -n +1 -F -s 0.1 --pid=$! "$stem.log" 2>/dev/null
exit "$(cat "$stem.rc")"
