"""The command line: train.py's LightningCLI (app), its shorthand flags (shorthand), the pre-launch checks (checks),
run names and output folders (outputs), flags over a checkpoint's settings (checkpoint_hparams) and srun's layout
(slurm)."""
