"""Never silently wrong about a checkpoint (docs/specs/config-guard.md): every published config.json
loads with nothing refused and no key unknown, while each switch a family's authors use to change
the forward or the decoder, set to a value fastdllm does not implement, is refused in one line that
names the key and the family, in every command (info warns instead)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fastdllm.checkpoints.family import family_of
from fastdllm.testing.tiny_gemma import gemma_config
from fastdllm.testing.tiny_illada import illada_config
from fastdllm.testing.tiny_moe import published_config
from fastdllm.testing.tiny_random import FIXTURES
from fastdllm.testing.tiny_rnd1 import rnd1_config
from fastdllm.testing.tiny_steerling import steerling_config
from fastdllm.errors import UserError
from fastdllm.models import FAMILIES
from fastdllm.models.config_guard import ABSENT_OK, REQUIRED, Switch

# Byte copies of the published config.json files (../shared/fixtures/published, SOURCES.md there),
# the package's own published files, and the tiny writers' copies of the configs not in either.
PUBLISHED = {p.stem: json.loads(p.read_text()) for p in sorted((Path(__file__).resolve().parents[1] / "published_configs").glob("*.json"))}
PUBLISHED.update({f"package:{p.parent.name}": json.loads(p.read_text()) for p in sorted(FIXTURES.glob("*/config.json"))})
PUBLISHED.update({"writer:rnd1": rnd1_config(), "writer:diffusion_gemma": gemma_config(),
                  "writer:llada_moe": published_config("llada_moe"), "writer:steerling": steerling_config(),
                  "writer:steerling-instruct": steerling_config(instruct=True), "writer:illada": illada_config()})
CLASSES = [(model_type, c) for model_type, families in FAMILIES.items() for c, _, _ in families]
BAD = ["fastdllm-test-value", -7, 3.5, True, {"rope_type": "yarn", "factor": 4.0}, ["sliding_attention"]]


pytestmark = pytest.mark.sweep   # each test's first case in the fast lane, the rest in the full suite (tests/conftest.py)


def test_every_family_came_with_its_published_configs():
    assert len(PUBLISHED) >= 16
    assert {c["model_type"] for c in PUBLISHED.values()} >= set(FAMILIES) - {"bailing_moe_v2"}


@pytest.mark.parametrize("name", PUBLISHED)
def test_every_published_config_loads_with_nothing_refused_or_unknown(name, tmp_path):
    _, _, notes = family_of(PUBLISHED[name], tmp_path)
    assert notes == []


def a_refused_value(switch: Switch, raw: dict):
    return next(v for v in BAD if not switch.implemented(v, raw))


def put(raw: dict, key: str, value) -> dict:
    node = raw = json.loads(json.dumps(raw))
    *parents, leaf = key.split(".")
    for part in parents:
        node = node[part]
    node[leaf] = value
    return raw


def drop(raw: dict, key: str) -> dict:
    node = raw = json.loads(json.dumps(raw))
    *parents, leaf = key.split(".")
    for part in parents:
        node = node[part]
    node.pop(leaf, None)
    return raw


@pytest.mark.parametrize("model_type, config_class", CLASSES, ids=lambda x: getattr(x, "__name__", x))
def test_each_switch_set_beyond_fastdllm_is_refused_in_one_line(model_type, config_class, tmp_path):
    base = next(c for c in PUBLISHED.values() if family_class(c) is config_class) if model_type != "bailing_moe_v2" \
        else dict(next(c for c in PUBLISHED.values() if c["model_type"] == "llada2_moe"), model_type="bailing_moe_v2")
    assert config_class.switches
    for switch in config_class.switches:
        bad = a_refused_value(switch, base)
        with pytest.raises(UserError) as raised:
            family_of(put(base, switch.key, bad), tmp_path)
        line = str(raised.value)
        assert line.startswith(f"config.json sets {switch.key}={bad!r} ({switch.meaning}); fastdllm's {model_type}")
        assert line.endswith("does not implement it yet") and "\n" not in line
        if switch.default is not ABSENT_OK and not switch.implemented(switch.default, base):
            with pytest.raises(UserError, match=f"config.json has no {switch.key}"):
                family_of(drop(base, switch.key), tmp_path)     # the authors' default is another model
        else:
            family_of(drop(base, switch.key), tmp_path)


def family_class(raw: dict):
    families = FAMILIES[raw["model_type"]]
    declared = set(raw.get("architectures") or families[0][2])
    return next(c for c, _, a in families if declared & set(a))


def test_llada22_block_routing_and_edit_tokens_load(tmp_path):
    """Block routing and InDel's edit tokens are implemented (docs/specs/llada2-2.md §2, §3); a routing
    block other than 32 is not."""
    raw = dict(PUBLISHED["inclusionAI__LLaDA2.1-mini"], expert_capacity=48, block_size=32,
               delete_token_id=156930, split_token_id=156931)
    config, _, notes = family_of(raw, tmp_path)
    assert (config.expert_capacity, config.routing_block, config.delete_token_id, config.split_token_id, notes) == (
        48, 32, 156930, 156931, [])
    for key, bad in (("expert_capacity", 0), ("expert_capacity", -1), ("expert_capacity", 4.5),
                     ("expert_capacity", True), ("expert_capacity", "48"), ("delete_token_id", -1),
                     ("split_token_id", "x")):
        with pytest.raises(UserError, match=f"sets {key}={bad!r}"):
            family_of(dict(raw, **{key: bad}), tmp_path)
    with pytest.raises(UserError) as raised:
        family_of(dict(raw, block_size=64), tmp_path)
    assert str(raised.value) == ("config.json sets block_size=64 (a routing block other than the attention's 32); "
                                 "fastdllm's llada2_moe does not implement it yet")


def test_absent_keys_mean_the_authors_defaults(tmp_path):
    """LLaDA's ModelConfig uses LayerNorm without layer_norm_type, DiffusionGemma's text model has no
    experts without num_experts: refused, not guessed. A missing rope_theta is the authors' 10000."""
    llada = PUBLISHED["GSAI-ML__LLaDA-8B-Instruct"]
    with pytest.raises(UserError, match="has no layer_norm_type: the authors' code then uses 'default'"):
        family_of(drop(llada, "layer_norm_type"), tmp_path)
    with pytest.raises(UserError, match="has no text_config.num_experts .*will not guess it"):
        family_of(drop(gemma_config(), "text_config.num_experts"), tmp_path)
    for name in ("GSAI-ML__LLaDA-8B-Instruct", "Dream-org__Dream-v0-Instruct-7B", "JetLM__SDAR-4B-Chat",
                 "Efficient-Large-Model__Fast_dLLM_v2_7B", "JetLM__SDAR-30B-A3B-Chat"):
        config, _, _ = family_of(drop(PUBLISHED[name], "rope_theta"), tmp_path)
        assert config.rope_theta == 10000.0, name


def test_unknown_keys_load_with_a_note(tmp_path):
    raw = dict(PUBLISHED["Dream-org__Dream-v0-Instruct-7B"], some_new_switch=3)
    _, _, notes = family_of(raw, tmp_path)
    assert notes == ["config.json has keys fastdllm's Dream does not know: some_new_switch (if one changes the "
                     "model, its answers may differ from its authors')"]
    _, _, notes = family_of(put(gemma_config(), "text_config.new_gemma_switch", 1), tmp_path)
    assert "text_config.new_gemma_switch" in notes[0]


@pytest.fixture(scope="module")
def llada22(tmp_path_factory):
    from fastdllm.testing.tiny_moe import write_llada2_moe

    path = write_llada2_moe(tmp_path_factory.mktemp("llada22") / "tiny-llada2.2")
    config = json.loads((path / "config.json").read_text())          # as a LLaDA2.2 download adds them
    (path / "config.json").write_text(json.dumps(dict(config, expert_capacity=4, block_size=64)))
    return path


COMMANDS = {
    "generate": ["generate", "-n", "32", "hi"],
    "chat": ["chat"],
    "serve": ["serve", "--port", "0"],
    "bench": ["bench", "-n", "32", "--configs", "baseline", "--n-prompts", "1", "-r", "1"],
    "eval": ["eval", "--tasks", "tiny_next_line", "--include-path", str(Path(__file__).resolve().parents[1] / "eval_task"),
             "--limit", "1"],
}


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_refuses_before_reading_weights(command, llada22, tmp_path):
    """The refusal comes first: from a copy without its weight files (which would be the error
    otherwise)."""
    from fastdllm.cli.app import app

    shutil.copytree(llada22, tmp_path / "m", ignore=shutil.ignore_patterns("*.safetensors"))
    r = CliRunner().invoke(app, [*COMMANDS[command], "-m", str(tmp_path / "m")], input="/bye\n")
    assert r.exit_code == 1, r.output
    assert r.stderr.strip().splitlines() == ["error: config.json sets block_size=64 (a routing block other than the "
                                             "attention's 32); fastdllm's llada2_moe does not implement it yet"]


def test_info_shows_the_refusal_as_a_warning(llada22):
    from fastdllm.cli.app import app

    r = CliRunner().invoke(app, ["info", str(llada22)])
    assert r.exit_code == 0, r.output
    assert "warning: config.json sets block_size=64" in r.stderr
    r = CliRunner().invoke(app, ["info", str(llada22), "--json"])
    assert json.loads(r.stdout)["warnings"][0].startswith("config.json sets block_size=64")
