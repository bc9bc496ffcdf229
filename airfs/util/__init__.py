"""Small helpers with no airfs state: path-keyed dictionaries indexed by directory
(:mod:`.pathindex`) and sparse file copies (:mod:`.fileutil`)."""
