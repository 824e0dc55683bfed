import pytest

from experiments.runtime.hostlist import HostlistError, expand_hostlist


@pytest.mark.parametrize(
    ("expression", "hosts"),
    [
        ("fd-n1", ["fd-n1"]),
        ("fd-n[1-2,5]", ["fd-n1", "fd-n2", "fd-n5"]),
        ("a1,b[01-03]", ["a1", "b01", "b02", "b03"]),
        ("b[08-11]", ["b08", "b09", "b10", "b11"]),
        ("x[1,3],y[2-3],z", ["x1", "x3", "y2", "y3", "z"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("n[1-2]-ib", ["n1-ib", "n2-ib"]),
        ("node.example.org", ["node.example.org"]),
        (" a , b ", ["a", "b"]),
        ("", []),
    ],
)
def test_expand(expression: str, hosts: list[str]) -> None:
    assert expand_hostlist(expression) == hosts


@pytest.mark.parametrize("expression", ["n[1-2", "n1-2]", "n[3-1]", "n[a-b]", "n[[1]]", "n[1-]"])
def test_rejects_malformed(expression: str) -> None:
    with pytest.raises(HostlistError, match="hostlist"):
        expand_hostlist(expression)
