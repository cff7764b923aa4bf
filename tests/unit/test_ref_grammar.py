"""singpy.oci.ref checks docker references without `re` (issue 31: `re` cost ~2.5 ms of every cached
`docker://` run): its hand-written checks must accept exactly what distribution's grammar, as regular
expressions, accepts."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from singpy.oci import ref

# Texts made mostly of the characters the grammar cares about, so that near misses are common.
GRAMMAR_CHARS = "aZ09_.-:/[]@ \n\u00e9\u0660"
texts = st.text(alphabet=st.sampled_from(GRAMMAR_CHARS) | st.characters(), max_size=40)
grammar_texts = st.text(alphabet=GRAMMAR_CHARS, max_size=40)


def regex(pattern: str, text: str) -> bool:
    return re.fullmatch(pattern, text, flags=re.ASCII) is not None


REPOSITORY = rf"{ref._PATH_COMPONENT}(?:/{ref._PATH_COMPONENT})*"


@settings(max_examples=600)
@given(st.one_of(texts, grammar_texts))
@example("a" * 128)
@example("a" * 129)
@example("_x")
@example(".x")
@example("x\n")
def test_tags_as_the_grammar(text: str) -> None:
    assert ref.valid_tag(text) == regex(ref._TAG, text)


@settings(max_examples=600)
@given(st.one_of(texts, grammar_texts))
@example("[::1]:5000")
@example("[]")
@example("[::1]x")
@example("a-.b")
@example("host:")
@example("127.0.0.1:5000")
@example("a:1:2")
@example("-a.b")
def test_registry_hosts_as_the_grammar(text: str) -> None:
    assert ref.valid_domain(text) == regex(ref._DOMAIN, text)


@settings(max_examples=600)
@given(st.one_of(texts, grammar_texts, st.text(alphabet="ab9._-/", max_size=30)))
@example("a__b")
@example("a___b")
@example("a--b")
@example("a._b")
@example("a//b")
@example("a/")
@example("library/alpine")
def test_repositories_as_the_grammar(text: str) -> None:
    assert ref.valid_repository(text) == regex(REPOSITORY, text)


def test_parsing_a_docker_reference_imports_no_re() -> None:
    """The point of the hand-written checks: a `docker://` run's reference is parsed without `re`."""
    code = ("import sys; from singpy.oci.ref import parse; "
            "parse('docker://127.0.0.1:5000/a/b__c:v1.0'); parse('docker://alpine'); print('re' in sys.modules)")
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).parents[2])
    assert done.stdout.strip() == "False", done.stderr
