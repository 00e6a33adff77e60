"""The policy objectives, one module per family: ``base`` (what every objective takes and returns, and the
registry), ``clip`` (PPO's clip), ``soft`` (CISPO, SAPO, GPG), ``coupled`` (GMPO, Clip-Cov, KL-Cov) and
``reinforce`` (DPPO, DRO, VESPO). ``grpo.objectives`` registers every family and is the path to import from.
"""
