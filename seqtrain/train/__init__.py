"""seqtrain-train: the epoch loop and everything that only training needs.

program.py           the front end: the parsed flags read once into a TrainConfig (train_config), and the `args`
                     record the checkpoints store (run_record)
loop.py              `train(cfg)`: fairseq_cli/train.py's flow (task, model, criterion, Trainer, epochs,
                     validation, checkpoints, graceful stop)
trainer.py           the Trainer: device, precision, one optimizer update, the state a resume needs
checkpoints.py       which checkpoints a run writes, keeps and resumes from (fairseq's names and policy)
rouge_validation.py  --eval-rouge: generate for the validation batches and score them
savedir_lock.py      one run per --save-dir
stop_signals.py      SIGTERM / SIGINT: finish the update, save, exit 143 / 130
flops.py             FLOPs of a step and known peaks, for the MFU figure
"""
