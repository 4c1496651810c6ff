package algorithm

import "testing"

// TestTable: IDs are 1, 2, ... in order, names and key codes distinct and
// every field an algorithm needs set; ByID finds each by its ID and nothing
// else. scripts/lua's TestAlgorithmTable checks the table against the Lua.
func TestTable(t *testing.T) {
	names, keys := map[string]bool{}, map[string]bool{}
	all := All()
	for i, a := range all {
		if a.ID != i+1 {
			t.Errorf("%s has ID %d at index %d: want index + 1", a.Name, a.ID, i)
		}
		if names[a.Name] || keys[a.Key] || a.Name == "" || a.Key == "" || a.State == "" || a.MaxCost == 0 {
			t.Errorf("%s: name or key code %q taken, or a field unset: %+v", a.Name, a.Key, a)
		}
		if (a.MaxLimit == 0) != (a.MaxLimitWhy == "") {
			t.Errorf("%s: MaxLimit %d with MaxLimitWhy %q: want both or neither", a.Name, a.MaxLimit, a.MaxLimitWhy)
		}
		names[a.Name], keys[a.Key] = true, true
		if b, ok := ByID(a.ID); !ok || *b != all[i] {
			t.Errorf("ByID(%d) = %v, %v", a.ID, b, ok)
		}
	}
	for _, id := range []int{0, len(all) + 1} {
		if _, ok := ByID(id); ok {
			t.Errorf("ByID(%d) found an algorithm", id)
		}
	}
	// All's slice is the caller's: changing it changes nothing here.
	all[0].Name = "changed"
	if b, _ := ByID(1); b.Name == "changed" {
		t.Error("changing All's slice changed the table")
	}
}
