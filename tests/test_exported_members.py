"""The public surface is exactly ``store.__all__``, sorted, and every name in it exists."""

import store


def test_all_is_sorted_and_complete() -> None:
    names = store.__all__
    assert names == sorted(names)
    for name in names:
        assert hasattr(store, name), name
    public = {n for n in dir(store) if not n.startswith("_") and n[0].isupper()}
    assert public <= set(names), public - set(names)


def test_every_public_callable_has_a_docstring() -> None:
    for name in store.__all__:
        obj = getattr(store, name)
        if callable(obj):
            assert obj.__doc__, f"{name} has no docstring"
