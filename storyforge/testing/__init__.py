"""Test support shipped with storyforge: a loopback model server (:mod:`.fake_server`)."""
