"""The on-disk formats and what every stage shares: atomic writes and manifests, arrays on disk (`npyio`),
writes past the page cache (`directwrite`), hashes, byte sizes, checksums, output directories, the store,
stored samples, plans and packed datasets, and their verification. Imports nothing else from `operators`
(the errors they raise are `diskflow.errors`'s), so a format can be read without the code that writes it."""

__all__: list[str] = []
