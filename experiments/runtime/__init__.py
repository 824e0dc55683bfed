"""The rank runtime: what any training script needs to take part in a Faultdrill run.

Nothing here imports a deep-learning framework, so the login node can use the checkpoint store
(newest valid checkpoint) and the hostlist expander without pulling in torch.
"""
