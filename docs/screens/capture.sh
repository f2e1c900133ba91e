#!/usr/bin/env bash
# Refresh the dashboard's text captures in docs/screens/ from a real run:
#
#   docs/screens/capture.sh            # from the repository root (uses .venv/bin/python if there)
#   PYTHON=python3 docs/screens/capture.sh
#
# Starts `kvbudget daemon` (gemma-3-27b, 4,096 blocks, no GPU needed) on a unix socket in a
# temp dir, two tenants with quotas, and a live Azure replay at 10x; then runs `kvbudget tui`
# in a detached tmux session at 120x40 and at 80x24, lets it draw, and writes what tmux shows
# (`capture-pane -p`) to dashboard-WxH.txt. The socket is given as a relative path
# (unix:kvbudget.sock, from inside the temp dir), so no machine path reaches the captures.
# Everything it started (tmux server, replay, daemon) is stopped and the temp dir removed,
# however it ends.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
if [[ -n "${PYTHON:-}" ]]; then
    python="$(command -v "$PYTHON")"
elif [[ -x "$root/.venv/bin/python" ]]; then
    python="$root/.venv/bin/python"
else
    python="$(command -v python3)"
fi
command -v tmux >/dev/null || { echo "capture.sh: needs tmux" >&2; exit 2; }

WARMUP_S="${WARMUP_S:-20}"   # load before the first capture: queues and preemptions build up
DRAW_S="${DRAW_S:-8}"        # dashboard start, first snapshot, sparklines filling
target="unix:kvbudget.sock"
rundir="$(mktemp -d)"
tmux_socket="$rundir/tmux.sock"   # a private tmux server: never touches the user's sessions
daemon_pid=""
replay_pid=""

cleanup() {
    tmux -S "$tmux_socket" kill-server 2>/dev/null || true
    for pid in "$replay_pid" "$daemon_pid"; do
        if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
            for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -9 "$pid" 2>/dev/null || true
        fi
    done
    rm -rf "$rundir"
}
trap cleanup EXIT

kvbudget() { (cd "$rundir" && "$python" -m kvbudget "$@"); }

(cd "$rundir" && exec "$python" -m kvbudget daemon --model gemma-3-27b --num-gpu-blocks 4096 \
    --memory-mode accounting --device cpu --listen "$target" --db-path decisions.db \
    --tenant acme=0.6 --tenant globex=0.6) \
    >"$rundir/daemon.log" 2>&1 &
daemon_pid=$!

for _ in $(seq 120); do
    kvbudget admin --target "$target" status >/dev/null 2>&1 && break
    kill -0 "$daemon_pid" 2>/dev/null || { echo "capture.sh: the daemon exited:" >&2; tail -5 "$rundir/daemon.log" >&2; exit 1; }
    sleep 0.5
done
kvbudget admin --target "$target" status >/dev/null

(cd "$rundir" && exec "$python" -m kvbudget replay azure --target "$target" --speed 10 --limit 2000) \
    >"$rundir/replay.log" 2>&1 &
replay_pid=$!
sleep "$WARMUP_S"
kill -0 "$replay_pid" 2>/dev/null || { echo "capture.sh: the replay ended early:" >&2; tail -5 "$rundir/replay.log" >&2; exit 1; }

for size in 120x40 80x24; do
    width="${size%x*}"
    height="${size#*x}"
    session="dashboard-$size"
    tmux -S "$tmux_socket" new-session -d -s "$session" -x "$width" -y "$height" -c "$rundir" \
        "$python -m kvbudget tui --target $target"
    sleep "$DRAW_S"
    # Belt and braces: should a path ever show up, it reads as $RUNDIR, not this machine's.
    tmux -S "$tmux_socket" capture-pane -p -t "$session" | sed "s|$rundir|\$RUNDIR|g" >"$here/dashboard-$size.txt"
    tmux -S "$tmux_socket" kill-session -t "$session"
    echo "wrote docs/screens/dashboard-$size.txt"
done
