"""Reading back what orbax saved: its metadata objects differ between orbax versions."""

from __future__ import annotations

import json
import os
import typing as tp

# orbax's step metadata file: orbax 0.11 has no public reader for its custom metadata.
_ORBAX_STEP_METADATA = "_CHECKPOINT_METADATA"


def orbax_tree_metadata(metadata: object) -> tp.Any:
  """The array tree of what `StandardCheckpointer.metadata(path)` returned (None: unreadable).

  orbax 0.12 wraps the tree in a StepMetadata (`item_metadata`, whose `tree` holds it) and
  returns None when a file cannot be read (its log says which); orbax 0.11 returns the tree.
  """
  tree = getattr(metadata, "item_metadata", metadata)
  return getattr(tree, "tree", tree)


def orbax_custom_metadata(metadata: object, path: str, key: str) -> object:
  """The entry `key` of a checkpoint's custom metadata, as saved with `custom_metadata=`.

  orbax 0.12 returns it with the metadata (None for an unreadable file); orbax 0.11 does not,
  so it is read from the step metadata file. Raises OSError/ValueError for an unreadable file.
  """
  custom = getattr(metadata, "custom_metadata", None)
  if not isinstance(custom, dict) or key not in custom:
    with open(os.path.join(path, _ORBAX_STEP_METADATA), encoding="utf-8") as f:
      custom = json.load(f).get("custom_metadata")
  return (custom or {}).get(key)
