"""The release: what leaves the run directory, and on what terms.

``certificate`` states the guarantee (epsilon, delta, the ledger, the assumptions it rests on);
``write`` builds release/ atomically (adapter, public config, certificate, model card) and
refuses any file not on the allow-list of ``files``, which also reads a release back;
``publish`` pushes release/ (never recovery/) to a hub; ``check`` checks a release against its
certificate (``dpgrpo release check``); ``load`` applies one to its base (``dpgrpo.load_release``).
"""
