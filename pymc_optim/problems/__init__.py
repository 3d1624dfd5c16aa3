"""What is solved: one module per problem type: its public function and optimality condition."""
