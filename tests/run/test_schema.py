import json

import pyarrow as pa
import pytest

from trustlens import TokenRecorder, __version__
from trustlens.run import (
    MANIFEST_FIELDS,
    META_SCHEMA_VERSION,
    META_TRUSTLENS_VERSION,
    SCHEMA_VERSION,
    TABLES,
    blocked_column,
    column_doc,
    part_path,
    rule_of_column,
    table_schema,
)
from trustlens.run.schema import frame_schema, part_index, rank_of_dir


def test_token_schema_is_the_contract():
    schema = table_schema("tokens", ["ppo", "dppo_binary_tv"])
    assert schema.names[:6] == ["step", "update", "sample", "group", "pos", "token_id"]
    assert [str(schema.field(n).type) for n in ("step", "update", "sample", "group", "pos", "token_id")] == [
        "int32",
        "int16",
        "int64",
        "int64",
        "int32",
        "int32",
    ]
    assert schema.field("token").type == pa.dictionary(pa.int32(), pa.string())
    floats = [
        "mu_logp",
        "old_logp",
        "pi_logp",
        "ratio",
        "binary_tv",
        "binary_kl",
        "topk_tv",
        "topk_kl",
        "entropy",
        "pi_logp_raw",
        "mu_topk_mass",
        "pi_topk_mass",
        "support_size",
        "pi_support_mass",
        "staleness",
        "advantage",
        "weight",
    ]
    assert schema.names[7:24] == floats and all(schema.field(n).type == pa.float32() for n in floats)
    assert schema.names[24:27] == ["seq_logratio_mu", "seq_logratio_old", "seq_tokens"]  # per response
    assert schema.field("seq_logratio_mu").type == pa.float64() and schema.field("seq_tokens").type == pa.int32()
    route = ["route_flips", "route_first_flip", "route_overlap", "route_layers", "route_mu_experts"]
    assert schema.names[27:33] == [*route, "route_pi_experts"]  # mixture-of-experts routing (issue 49)
    assert schema.field("route_flips").type == pa.int16() and schema.field("route_layers").type == pa.list_(pa.int16())
    assert schema.names[33] == "seq_weight" and schema.field("seq_weight").type == pa.float32()
    assert schema.names[34:] == ["blocked_ppo", "blocked_dppo_binary_tv"]
    assert schema.field("blocked_ppo").type == pa.bool_()
    assert not schema.field("pi_logp").nullable and schema.field("mu_logp").nullable
    assert schema.metadata[META_SCHEMA_VERSION] == str(SCHEMA_VERSION).encode()
    assert schema.metadata[META_TRUSTLENS_VERSION] == __version__.encode()


def test_rank_is_the_folders_not_a_file_column():
    for table in TABLES:
        assert "rank" not in table_schema(table, ["ppo"]).names
        assert frame_schema(table, ["ppo"]).field("rank").type == pa.int16()
    assert frame_schema("tokens").names[:3] == ["step", "update", "rank"]
    assert frame_schema("metrics").names == ["step", "rank", "name", "value"]
    assert "rank=R folder" in column_doc("rank")


def test_layout_names():
    assert part_index("part-000012.parquet") == 12
    for name in ("part-000012.parquet.tmp", ".part-000001.parquet.tmp", "part-1 (copy).parquet", "part-.parquet"):
        assert part_index(name) is None
    assert rank_of_dir("rank=3") == 3
    for name in ("rank=0 copy", "rank=", "rank=-1", "rank=01", "rank=x", "ranks=1"):
        assert rank_of_dir(name) is None


def test_every_column_has_a_doc():
    for table in TABLES:
        for name in frame_schema(table, ["ppo"]).names:
            assert column_doc(name)
    assert "'ppo'" in column_doc("blocked_ppo")
    with pytest.raises(KeyError, match="unknown column 'nope'"):
        column_doc("nope")
    with pytest.raises(KeyError, match="unknown table 'nope'"):
        table_schema("nope")


def test_rule_columns_round_trip():
    assert rule_of_column(blocked_column("dppo_topk_kl")) == "dppo_topk_kl"
    assert rule_of_column("ratio") is None


def test_part_path_layout(tmp_path):
    assert part_path(tmp_path, "tokens", 3, 12) == tmp_path / "tokens" / "rank=3" / "part-000012.parquet"


def test_manifest_fields_document_what_the_recorder_writes(tmp_path):
    with TokenRecorder(tmp_path / "run", rules=["ppo"]):
        pass
    manifest = json.loads((tmp_path / "run" / "run.json").read_text())
    assert set(manifest) == set(MANIFEST_FIELDS)
