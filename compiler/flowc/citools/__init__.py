"""Tools for pipeline authors' CI (DESIGN §1, "golden-file checks in their CI"; docs/ci.md).

- `bundles`: where `flowc build` writes without `-o`, and `flowc build --check`: is the
  committed bundle what the `.flow` file builds today?
- `cases`, `events`, `golden`, `junit`: `flowc test`, golden event tests of pipelines: finding
  the cases, comparing a call's events the way the language defines them, running and
  re-recording them, JUnit XML for CI systems.
- `surface`, `semantic`, `revisions`: `flowc diff`, what callers and operators see of a
  pipeline, compared between two versions and classified breaking or compatible.
- `commands`: the click commands `test` and `diff` (`flowc.cli` registers them).
"""
