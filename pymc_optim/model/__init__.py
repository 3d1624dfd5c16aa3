"""Model plumbing: helpers that take a pm.Model and return a new model or an InferenceData."""
