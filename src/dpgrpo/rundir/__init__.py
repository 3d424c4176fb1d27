"""The run directory on disk: its layout, its one writer, and what survives a crash.

``layout`` names the files (:class:`RunDir`); ``lock`` keeps a second writer out; ``atomic``
writes each file whole or not at all; ``checkpoint`` saves and verifies the recovery state;
``resume`` decides what a restarted run may continue from without lowering the certified epsilon.
"""
