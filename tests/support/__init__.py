"""The tests' support code, also used by the benchmarks and the docs: a loopback model server
(:mod:`.fake_server`, ``python -m tests.support.fake_server`` from the checkout's root), the
test set-up (:mod:`.setup`), a throwaway PostgreSQL server, tiny models and scripted runs.
None of it is installed with storyforge, and nothing in storyforge imports it."""
