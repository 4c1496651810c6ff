// Package algorithm is the table of the rate limit algorithms: for each,
// the facts the Go side needs to name it, key it and call its Lua code (its
// ID, name, key code, state and bounds). It is the one place an algorithm
// is added, with its Lua file in scripts/lua: internal/config takes the
// names a rule may ask for from here, internal/limiter what it sends to
// Redis, and scripts/lua assembles the Lua from it (each algorithm's file,
// and its ID as the constant ALG_<NAME>). scripts/lua's tests check the Lua
// against this table.
//
// The package depends on nothing of the service's, so that a YAML validator
// (internal/config) can name the algorithms without depending on Redis Lua.
package algorithm

import "slices"

// Descriptor describes one rate limit algorithm.
type Descriptor struct {
	// ID is the algorithm's number in the hit codes of decide.lua and in
	// refund.lua's arguments, and its index in decide.lua's algorithms
	// table: 1, 2, ... in the table's order. The Lua sees it as ALG_<NAME>
	// (see scripts/lua's Constants). internal/config's Algorithm values are
	// these IDs.
	ID int
	// Name is the algorithm's name in the config file. It is also the name
	// of its Lua file in scripts/lua (Name + ".lua") and of the local table
	// that file defines, with the functions check, commit, result, refund
	// and undo.
	Name string
	// Key ends the algorithm's store keys, before the window: a counter of
	// one algorithm is never read as another's. An algorithm with
	// ReferenceKeys has it only as its name among the others' codes.
	Key string
	// ReferenceKeys marks an algorithm keyed as envoyproxy/ratelimit keys
	// its counters (limiter.KeyBuilder's ResetReference), so that its
	// replicas and this service share them.
	ReferenceKeys bool
	// State says what the algorithm keeps at its key.
	State string
	// Bucket marks a token bucket (GCRA): its hits carry the bucket's size
	// (":burst" after the cost), which is the most its counter holds, and
	// its refunds take the hit's limit and window.
	Bucket bool
	// MaxCost is the largest cost the algorithm's Lua is exact for; larger
	// costs are sent as MaxCost, which no counter holds anyway.
	MaxCost uint64
	// MaxLimit is the largest limit a rule of this algorithm may have, 0
	// for no bound; MaxLimitWhy says why, in the config's error message.
	MaxLimit    uint32
	MaxLimitWhy string
}

// table holds the algorithms in ID order (IDs 1, 2, ...): the order their
// Lua files are concatenated in and their index in decide.lua's algorithms
// table. A new algorithm is one entry here plus its Lua file in scripts/lua
// (see Descriptor.Name), which scripts/lua's *.lua embed picks up.
var table = []Descriptor{
	{
		ID: 1, Name: "sliding_window_log", Key: "log",
		State:   "a sorted set of the admitted units, scored by the microsecond they came",
		MaxCost: 1 << 53, // Lua numbers are exact up to 2^53; see scripts/lua/prelude.lua's max_count
		// The log stores one member per admitted unit, so memory per key,
		// and the time one script holds Redis to record a heavy weighted
		// hit, grow with the limit; beyond this the sliding_window_counter
		// keeps constant memory.
		MaxLimit:    10_000,
		MaxLimitWhy: "one stored member per unit; use sliding_window_counter",
	},
	{
		ID: 2, Name: "sliding_window_counter", Key: "counter",
		State:   `the string "<window index>:<count>:<previous window's count>"`,
		MaxCost: 1 << 53,
	},
	{
		ID: 3, Name: "fixed_window", Key: "fixed",
		State:   `the string "<window index>:<count>"`,
		MaxCost: 1 << 53,
	},
	{
		ID: 4, Name: "gcra", Key: "gcra",
		State:   `the string "<whole>:<remainder>", the bucket's theoretical arrival time in Unix microseconds`,
		Bucket:  true,
		MaxCost: 1 << 32, // scripts/lua/gcra.lua is exact for costs up to 2^32
	},
	{
		ID: 5, Name: "reference_fixed_window", Key: "reference", ReferenceKeys: true,
		State:   "envoyproxy/ratelimit's count, a plain integer, at its own key for the window",
		MaxCost: 1 << 53,
	},
}

// All returns every algorithm, in ID order (IDs 1, 2, ...). The slice is
// the caller's.
func All() []Descriptor { return slices.Clone(table) }

// ByID returns the algorithm whose ID is id. The Descriptor is shared:
// callers read it and never change it.
func ByID(id int) (*Descriptor, bool) {
	if id < 1 || id > len(table) {
		return nil, false
	}
	return &table[id-1], true
}
