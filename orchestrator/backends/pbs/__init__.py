"""PBS: a submitit executor plugin over qsub, qstat -f, qdel and qrerun."""
