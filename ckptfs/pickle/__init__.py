"""The safe unpickler: pickles become inert data; nothing a pickle names is imported or run."""
