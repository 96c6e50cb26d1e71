"""The fleet simulation on tiny configurations: the GLM-5.3 perf table from aiconfigurator-core,
the seed's topology read from conf/serving/glm5_gpu.yaml, Dynamo's offline replay of a P:D
fleet, live mocker engines behind the real frontend (loopback, nothing left running), and the
session shape read from a run folder's records."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from serving.simulate import perf, workload
from serving.simulate.cli import load, main
from tests.procs import new_job_processes, process_table

TINY = ["simulate.sessions=2", "simulate.lifetimes=2", "simulate.first_prompt=2000",
        "simulate.growth=1000", "simulate.max_prompt=4000", "simulate.output=16",
        "simulate.tool_s=0.2"]


def test_the_seed_topology_comes_from_the_serving_config():
    serving, cfg, _, _ = load(["serving=glm5_gpu", "simulate=h200"])
    from serving.simulate.config import topology

    topo = topology(serving)
    assert (topo["prefill"], topo["decode"], topo["tp"]) == (1, 4, 8)
    assert topo["kv_cache_dtype"] == "nvfp4" and topo["nextn"] == 1
    assert topo["prefill_batched_tokens"] == 16384
    assert cfg.system == "h200_sxm" and cfg.transfer_gbps == 40.0


def test_nvfp4_rows_hold_more_tokens_than_fp8_ones():
    # rows of ../shared/notes/kv-formats.md plus the DSA indexer's 132 B, on 78 + 1 layers
    assert perf.kv_bytes_per_token("nvfp4") == 79 * (352 + 132)
    assert perf.kv_bytes_per_token("fp8") == 79 * (576 + 132)
    assert perf.kv_bytes_per_token("fp8_ds_mla") == 79 * (656 + 132)
    assert perf.kv_bytes_per_token("fp8") / perf.kv_bytes_per_token("nvfp4") > 1.46


def test_offline_replay_of_a_tiny_disaggregated_fleet(tmp_path: Path, capsys):
    out = tmp_path / "run.json"
    rc = main(["run", "serving=glm5_gpu", *TINY, f"simulate.out={out}",
               f"cache_dir={tmp_path / 'cache'}", f"work_dir={tmp_path / 'work'}"])
    assert rc == 0
    got = json.loads(out.read_text())
    r = got["result"]
    assert got["fleet"] == "1P:4D" and r["requests"] >= 3
    assert 0 < r["ttft_p90_s"] < 60 and r["tok_s_user"] > 10
    assert r["prefix_reuse"] > 0.2  # later turns reuse the earlier turns' prefix
    assert "aiconfigurator-core 0.12.0" in got["perf_model"] and "gb200" in got["perf_model"]
    profile = np.load(next((tmp_path / "cache" / "sim").glob("*.npz")))
    assert profile["decode_itl"].shape[0] == len(profile["decode_active_kv_tokens"])
    itl = profile["decode_itl"][:, -1]
    assert itl[-1] > 2 * itl[0]  # a step over 4 M tokens of KV is slower than over one request
    assert "| 1P:4D |" in capsys.readouterr().out


def test_the_same_seed_gives_the_same_trace_and_numbers(tmp_path: Path):
    """Ours is deterministic: the same seed writes the same trace, and the replay of it with
    round-robin routing gives the same figures. (With the KV router it does not: Dynamo 1.6.1's
    replay breaks ties between equal-cost workers at random; README, Known limits.)"""
    def run(name: str, seed: int) -> tuple[dict, bytes]:
        out, work = tmp_path / f"{name}.json", tmp_path / name
        rc = main(["run", "serving=glm5_gpu", *TINY, "simulate.sessions=4",
                   "simulate.policy=round_robin", f"simulate.seed={seed}", f"simulate.out={out}",
                   f"cache_dir={tmp_path / 'cache'}", f"work_dir={work}"])
        assert rc == 0
        [trace] = work.glob("trace_*.jsonl")
        result = json.loads(out.read_text())["result"]
        return {k: v for k, v in result.items() if k != "wall_s"}, trace.read_bytes()

    first, again, other = run("a", 0), run("b", 0), run("c", 1)
    assert first == again
    assert other[1] != first[1] and other[0] != first[0]


def test_live_mocker_engines_behind_the_real_frontend(tmp_path: Path):
    before = process_table()
    out = tmp_path / "live.json"
    rc = main(["run", "serving=kv_routed", "serving.engines=1", "serving.tensor_parallel=8",
               "simulate.mode=live",
               "simulate.policy=kv_soft", "simulate.speedup_ratio=10", *TINY,
               f"simulate.out={out}", f"cache_dir={tmp_path / 'cache'}",
               f"work_dir={tmp_path / 'work'}"])
    assert rc == 0
    r = json.loads(out.read_text())["result"]
    assert r["mode"] == "live" and r["policy"] == "kv_soft" and r["requests"] == 2 * 2 * 3
    assert r["ttft_p50_s"] > 0 and r["tok_s_user"] > 0
    assert new_job_processes(before) == []


def test_record_shapes_are_read_from_a_run_folder(tmp_path: Path):
    (tmp_path / "data").mkdir()
    turns = [[{"prompt_tokens": 1000, "completion_tokens": 50, "tool_s": 1.5},
              {"prompt_tokens": 1600, "completion_tokens": 40, "tool_s": 0.5}]]
    pq.write_table(pa.table({"turns": turns}), tmp_path / "data" / "part-00000000.parquet")
    shapes = workload.read_records(tmp_path)
    assert shapes == [[workload.Turn(1000, 50, 1.5), workload.Turn(1600, 40, 0.5)]]
    drawn = workload.record_sessions(shapes, 3, token_scale=10.0)
    assert drawn[0][1] == workload.Turn(16000, 400, 0.5)
    summary = workload.shape_summary(drawn)
    assert summary["mean_growth"] == 6000 and summary["turns_per_session"] == 2
    trace = workload.write_trace(tmp_path / "t.jsonl", drawn[:1])
    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    assert lines[1]["hash_ids"][:len(lines[0]["hash_ids"])] == lines[0]["hash_ids"]
    assert lines[1]["delay"] == 1500.0


def test_a_tiny_sweep_runs_its_points_side_by_side(tmp_path: Path):
    out = tmp_path / "sweep.json"
    tiny = [x for x in TINY if not x.startswith("simulate.sessions=")]
    rc = main(["sweep", "serving=glm5_gpu", *tiny, "simulate.sweep_sessions=[2]",
               "simulate.sweep_policies=[kv]", "simulate.jobs=2", f"simulate.out={out}",
               f"cache_dir={tmp_path / 'cache'}", f"work_dir={tmp_path / 'work'}"])
    assert rc == 0
    got = json.loads(out.read_text())
    assert [x["ratio"] for x in got["results"]] == [f"1:{k}" for k in range(1, 7)]
    assert all(x["requests"] >= 3 and x["policy"] == "kv" for x in got["results"])
    assert got["simulations"] == 6 and set(got["breaks"]) == {f"1:{k} kv" for k in range(1, 7)}
