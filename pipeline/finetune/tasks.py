"""The tasks ``train-adapter`` trains, by name: the CLI lists them without importing the data code
(torch); :data:`pipeline.finetune.data.FORMATS` defines each format task, in this order."""

TASKS = ("code", "json", "yaml", "xml", "bullets", "numbered", "tldr", "heading")
