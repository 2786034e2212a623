"""JSON-Schema-Test-Suite (drafts 2020-12, 7, 4): compiled schemas accept no instance jsonschema rejects."""

import json
import pathlib
import re
from functools import lru_cache

import jsonschema
import pytest

from sglpy.grammar.budget import CompileBudget
from sglpy.grammar.errors import GrammarError
from sglpy.grammar.json.schema import compile_schema

SUITE = pathlib.Path(__file__).resolve().parent / "json_schema_test_suite"  # vendored, MIT (its LICENSE)
DRAFTS = {"draft2020-12": ("2020-12", jsonschema.Draft202012Validator),
          "draft7": ("7", jsonschema.Draft7Validator), "draft4": ("4", jsonschema.Draft4Validator)}
# ratchets, below the benchmark's numbers (benchmarks/README.md) to absorb a loaded CI box's slower compiles
MIN_COMPILED = {"draft2020-12": 335, "draft7": 225, "draft4": 145}
MIN_VALID_ACCEPTED = {"draft2020-12": 600, "draft7": 460, "draft4": 285}
REFUSAL = re.compile(r"keyword '|\$ref|regex construct|automaton too large|regex too large|time budget|"
                     r"admits no document|nested too deeply|does not resolve|too many")


def _documents(folder: str) -> dict:
    """The remote documents the draft's cases name: the suite's remotes/ (served at http://localhost:1234/ in the
    suite's own runs) and the metaschemas; handed to the compiler and to jsonschema, so nothing is fetched."""
    from jsonschema_specifications import REGISTRY

    docs = {uri: REGISTRY.contents(uri) for uri in REGISTRY}
    for path in sorted((SUITE / "remotes").rglob("*.json")):
        rel = path.relative_to(SUITE / "remotes").as_posix()
        if not rel.startswith("draft") or rel.startswith(folder + "/"):
            docs["http://localhost:1234/" + rel] = json.loads(path.read_text(encoding="utf-8"))
    return docs


def _registry(docs: dict, V):
    from referencing import Registry, Resource
    from referencing.exceptions import NoSuchResource
    from referencing.jsonschema import specification_with

    spec = specification_with(V.META_SCHEMA["$schema"])

    def retrieve(uri: str):
        if uri not in docs:
            raise NoSuchResource(ref=uri)
        return Resource.from_contents(docs[uri], default_specification=spec)

    return Registry(retrieve=retrieve)


@lru_cache(maxsize=None)
def _run(folder: str) -> dict:
    draft, V = DRAFTS[folder]
    docs = _documents(folder)
    registry = _registry(docs, V)
    out = {"compiled": 0, "schemas": 0, "valid_accepted": 0, "unsound": [], "bad_errors": []}
    files = sorted((SUITE / folder).glob("*.json"))
    assert files, f"no suite files under {SUITE / folder}"
    for path in files:
        for case in json.loads(path.read_text(encoding="utf-8")):
            out["schemas"] += 1
            try:
                dfa = compile_schema(case["schema"], budget=CompileBudget(time_s=0.5),
                                     default_draft=draft, documents=docs).dfa
            except GrammarError as e:
                if not REFUSAL.search(str(e)):
                    out["bad_errors"].append(str(e))
                continue
            out["compiled"] += 1
            validator = V(case["schema"], registry=registry)
            for t in case["tests"]:
                text = json.dumps(t["data"], separators=(", ", ": "), ensure_ascii=False).encode()
                if dfa.fullmatch(text):
                    try:
                        valid = validator.is_valid(t["data"])
                    except re.error:  # \p{..}, which Python's re (jsonschema's) cannot parse: the suite answers
                        valid = t["valid"]
                    if not valid:
                        out["unsound"].append((path.name, case["description"], t["description"]))
                    else:
                        out["valid_accepted"] += 1
    return out


@pytest.mark.parametrize("folder", sorted(DRAFTS))
def test_suite_is_sound_and_covered(folder):
    r = _run(folder)
    assert r["unsound"] == []
    assert r["bad_errors"] == []  # every refusal names a keyword, a construct or a limit
    assert r["compiled"] >= MIN_COMPILED[folder], r["compiled"]
    assert r["valid_accepted"] >= MIN_VALID_ACCEPTED[folder], r["valid_accepted"]
