#!/usr/bin/env bash
# CI, between the test suite and the smoke run: nothing the tests started may keep a core busy while every
# paper's smoke is timed. Prints the busiest processes, then ends orphans (parent pid 1) that run this
# checkout's .venv (Python, snakemake) or a SLURM job step, naming each one it ends. Exit 0 either way: this is hygiene, and
# a test that leaks a process is reported here by name.
set -uo pipefail
venv_bin="$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/"
echo "busiest processes after the tests (pcpu is the average over each process's life):"
ps -eo pid,ppid,etimes,pcpu,args --sort=-pcpu | head -8 | cut -c1-160
found=0
while read -r pid ppid args; do
    [[ $ppid == 1 ]] || continue
    case $args in
    "$venv_bin"* | *slurmstepd*)
        echo "ending leftover process $pid: ${args:0:160}"
        kill -TERM "$pid" 2>/dev/null && found=$((found + 1))
        ;;
    esac
done < <(ps -eo pid=,ppid=,args=)
sleep 2
echo "leftover processes ended: $found"
