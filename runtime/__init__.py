"""sglpy runtime: shared types (sampling_params, messages, core, config) and engine/, memory/, model/, server/, testing/."""
