"""edged.models: the model package format and the demo-model fetcher."""
