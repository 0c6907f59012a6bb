"""Generative side of gpzoo: kernels (priors), likelihoods and the model zoo."""
