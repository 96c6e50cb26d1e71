# Session folders on disk (/tmp, ext4) and in memory (/dev/shm, tmpfs), 1,024 sessions on the
# mocker, one after the other in each order (2026-12-05).
# disk_first.json (05:36, at 1b1da59 with a local edit of bench_rollout.py that added a path
# "per command shm" = the per-command path with env.scratch_dir=/dev/shm; "per command" then
# kept session folders in the system temp folder, /tmp):
#   python scripts/bench_rollout.py --parts ceiling --sessions 1024 \
#       --sandbox-paths "per command,per command shm" --more-actors 0 --max-load 1.2 \
#       --max-wait-s 60 --source <part-0 run> --out bench/rollout_homes/disk_first.json
# memory_first.json (05:54, at a8ce1d8: "per command" keeps them in /dev/shm by default,
# "per command homes on disk" sets env.scratch_dir=/tmp):
python scripts/bench_rollout.py --parts ceiling --sessions 1024 \
    --sandbox-paths "per command,per command homes on disk" --more-actors 0 --max-load 1.2 \
    --max-wait-s 90 --source "$1" --out bench/rollout_homes/memory_first.json
