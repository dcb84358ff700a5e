"""seqtrain-preprocess: raw text (or JSON lines, parquet, datasets folders) to a fairseq data-bin.

databin.py   `preprocess(args)`: check the inputs, train or load the tokenizer, count the dictionaries,
             binarize the splits in parallel, publish the data-bin whole
jsonl.py     --jsonl input: JSON lines to the line-aligned text the binarizer reads
tables.py    --parquet / --load-from-disk input (pyarrow): the same, from parquet files and save_to_disk folders
scratch.py   the hidden work folder the data-bin is built in, removed on any exit
"""
