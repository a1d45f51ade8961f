"""Training the lab's small models (`python -m training.train`): outside the inference
package, which only loads what this writes (HF-format checkpoints)."""
