"""Reports: the pages, tables and figures made from evaluated arms, budgets and audits.

``comparison`` pairs arms with the base and with each other (intervals, tests, MDEs);
``compare`` / ``tables`` / ``figures`` write `dpgrpo compare`'s report; ``budget`` the privacy
budget report; ``study`` the CPU study's page; ``inputs`` reads what they are made from.
"""
