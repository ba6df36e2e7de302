"""The `bait` command (:mod:`bait.cli`): the composition root above :mod:`service` and :mod:`worker`."""
