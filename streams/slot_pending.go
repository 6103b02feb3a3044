package streams

import "hash/fnv"

// Placeholder until main lands the subject shape (layout.md): removed at the merge.

// Slots is the fixed number of hash slots.
const Slots = 64

// Slot is the hash slot of request id.
func Slot(id string) int {
	h := fnv.New32a()
	h.Write([]byte(id))
	return int(h.Sum32() % Slots)
}
