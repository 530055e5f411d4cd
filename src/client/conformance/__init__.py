"""`pyrigaud conformance`: the manager's contract, clause by clause, against any endpoint."""
