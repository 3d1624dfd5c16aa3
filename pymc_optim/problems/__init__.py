"""What is solved: one module per problem type: its public function and optimality condition.

The public functions are parallel on purpose: they share argument names (`x0`, `method`,
`bracket`, `structure`, `optimizer_kwargs`), each documents all of its own arguments (so that
``help()`` shows a whole page), and each picks graph-native Newton or its scipy Op the same way;
folding them into shared templates would hide each function's contract from its reader.
"""
