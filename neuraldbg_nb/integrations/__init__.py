"""Framework callbacks: the watch inside the training loops of Lightning and Hugging Face
transformers. Each module imports its framework when it is imported itself, never before:
`import neuraldbg_nb` needs neither."""
