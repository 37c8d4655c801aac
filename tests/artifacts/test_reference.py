import pytest

from ingot.artifacts.reference import InvalidReference, Reference, parse_reference

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("oci://127.0.0.1:5000/models/llama:v1", Reference("127.0.0.1:5000", "models/llama", "v1")),
        ("oci://localhost/llama:awq-4bit", Reference("localhost", "llama", "awq-4bit")),
        (f"oci://r.example.com/a/b/c@{DIGEST}", Reference("r.example.com", "a/b/c", None, DIGEST)),
        (
            f"oci://r.io/my.models/x__y:v1@{DIGEST}",
            Reference("r.io", "my.models/x__y", "v1", DIGEST),
        ),
        ("oci://[::1]:5000/m:v1", Reference("[::1]:5000", "m", "v1")),
    ],
)
def test_valid_references(text, expected):
    ref = parse_reference(text)
    assert ref == expected
    assert str(ref) == text


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("127.0.0.1:5000/models/llama:v1", "starts with oci://"),
        ("oci://registry.example.com", "missing the repository"),
        ("oci:///models/llama:v1", "missing the registry host"),
        ("oci://host:99999/m:v1", "port '99999'"),
        ("oci://host/Models/llama:v1", "component 'Models'"),
        ("oci://host/models//llama:v1", "component ''"),
        ("oci://host/models/llama", "name a tag"),
        ("oci://host/models/llama:.bad", "tag '.bad'"),
        ("oci://host/models/llama@sha256:abc", "is not sha256:<64"),
        ("oci://host/models/llama@md5:" + "a" * 32, "is not sha256:<64"),
        ("oci://bad_host/m:v1", "not a valid host name"),
    ],
)
def test_invalid_references_say_why(text, why):
    with pytest.raises(InvalidReference, match=why.replace("(", r"\(")):
        parse_reference(text)


def test_loopback_detection():
    assert parse_reference("oci://localhost:5000/m:v1").is_loopback
    assert parse_reference("oci://127.0.0.2/m:v1").is_loopback
    assert parse_reference("oci://[::1]:5000/m:v1").is_loopback
    assert not parse_reference("oci://10.0.0.1:5000/m:v1").is_loopback
    assert not parse_reference("oci://registry.example.com/m:v1").is_loopback
    ref = parse_reference("oci://localhost:5000/m:v1").with_digest(DIGEST)
    assert ref.pinned() == f"localhost:5000/m@{DIGEST}"
