"""Gradients at hook points (run_with_cache(grads=True)): the loss against one computed here from the
logits (double) and against `phasescope grad`'s, explicit targets against the next-token default, and the
gradient at hook_z against a central difference of the loss along it (a Python hook shifting hook_z)."""
import json

import numpy as np
import pytest

import phasescope as ps
from conftest import cli, model_path, read_safetensors, tokens

Z = "blocks.10.attn.hook_z"
CK = "blocks.10.attn.hook_ck"


def mean_nll(logits, targets):
    lg = logits.astype(np.float64)
    lse = np.log(np.exp(lg - lg.max(-1, keepdims=True)).sum(-1)) + lg.max(-1)
    mask = targets >= 0
    picked = np.take_along_axis(lg, np.where(mask, targets, 0)[..., None], -1)[..., 0]
    return float(((lse - picked) * mask).sum() / mask.sum()), int(mask.sum())


def next_targets(toks):
    y = np.full_like(toks, -1)
    y[:, :-1] = toks[:, 1:]
    return y


def test_loss_and_targets(deep, tmp_path):
    toks = tokens(2, 40, deep.vocab_size, salt=3)
    logits, cache, grads = deep.run_with_cache(toks, names=[Z, CK], grads=True)
    here, n = mean_nll(logits, next_targets(toks))
    assert grads.n_targets == n == 2 * 39
    assert abs(grads.loss - here) < 1e-5 * (1 + abs(here))
    assert set(grads) == {Z, CK} and grads[Z].shape == cache[Z].shape and grads[Z].dtype == np.float32
    # explicit next-token targets are the default
    _, _, g2 = deep.run_with_cache(toks, names=[Z], grads=True, targets=next_targets(toks))
    assert g2.loss == grads.loss and g2[Z].tobytes() == grads[Z].tobytes()
    # a subset of targets
    y = np.full_like(toks, -1)
    y[:, 30] = 5
    lg, _, g3 = deep.run_with_cache(toks, names=[Z], grads=True, targets=y)
    want, n3 = mean_nll(lg, y)
    assert g3.n_targets == n3 == 2 and abs(g3.loss - want) < 1e-5 * (1 + abs(want))
    assert np.all(g3[Z][:, 31:] == 0), "a gradient reached positions after the only target"
    # `phasescope grad` (one sequence, as it runs them): its loss
    one = toks[:1]
    tp, yp, op = tmp_path / "t.json", tmp_path / "y.json", tmp_path / "g.safetensors"
    tp.write_text(json.dumps(one.tolist()))
    yp.write_text(json.dumps(next_targets(one).tolist()))
    cli("grad", "--model", model_path("data/models/deep_w8s8"), "--tokens", tp, "--targets", yp, "--out", op)
    cli_loss = float(read_safetensors(op)["loss"][0])
    _, _, g1 = deep.run_with_cache(one, names=[Z], grads=True)
    assert abs(g1.loss - cli_loss) <= 1e-6 * (1 + abs(cli_loss)), (g1.loss, cli_loss)


def test_gradient_against_central_difference(deep):
    toks = tokens(1, 40, deep.vocab_size, salt=4)
    y = next_targets(toks)
    _, _, grads = deep.run_with_cache(toks, names=[Z], grads=True)
    g = grads[Z].astype(np.float64)
    norm = np.sqrt((g * g).sum())
    assert norm > 0
    d = (g / norm).astype(np.float32)
    lp = []
    for eps in (0.02, -0.02):
        def shift(a, name, eps=eps):
            a += np.float32(eps) * d

        lp.append(mean_nll(deep.run_with_hooks(toks, [(Z, shift)]), y)[0])
    fd = (lp[0] - lp[1]) / 0.04
    assert abs(fd - norm) <= 0.02 * norm + 1e-7, (fd, norm)


def test_unreachable_point_is_an_error(deep):
    toks = tokens(1, 20, deep.vocab_size)
    with pytest.raises(ps.PhasescopeError, match="hook_z"):
        deep.run_with_cache(toks, names=["blocks.3.hook_mlp_out"], grads=True)
    # with a predicate, the points the backward does not reach get no gradient
    _, cache, grads = deep.run_with_cache(toks, names=lambda n: n.startswith("blocks.11."), grads=True)
    assert "blocks.11.hook_mlp_out" in cache and "blocks.11.hook_mlp_out" not in grads
    assert "blocks.11.attn.hook_z" in grads
