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
tail -n +1 -F "$stem.log" 2>/dev/null &
shown=$!
until [ -s "$stem.pid" ]; do sleep 0.05; done
until [ -s "$stem.rc" ]; do sleep 0.1; done
sleep 0.3  # the log's last lines shown
kill "$shown"
exit "$(cat "$stem.rc")"
