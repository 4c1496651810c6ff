package main

import (
	"bytes"
	"runtime/debug"
	"testing"
)

func TestByteSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		str  string
	}{
		{"0", 0, "0"},
		{"200MiB", 200 << 20, "200MiB"},
		{"1GiB", 1 << 30, "1GiB"},
		{"1024KiB", 1 << 20, "1MiB"},
		{"1500B", 1500, "1500B"},
		{"1500", 1500, "1500B"},
		{"2TiB", 2 << 40, "2TiB"},
	} {
		var b byteSize
		if err := b.Set(tc.in); err != nil {
			t.Fatalf("%q: %v", tc.in, err)
		}
		if int64(b) != tc.want || b.String() != tc.str {
			t.Errorf("%q: %d %q, want %d %q", tc.in, int64(b), b.String(), tc.want, tc.str)
		}
	}
	for _, bad := range []string{"", "MiB", "-1MiB", "200MB", "1.5GiB", "200 MiB", "9999999TiB"} {
		var b byteSize
		if err := b.Set(bad); err == nil {
			t.Errorf("%q: accepted as %d", bad, int64(b))
		}
	}
}

// TestMemoryLimit: the flag's default, 0 for none, and GOMEMLIMIT winning
// over the flag. The runtime's settings are restored after.
func TestMemoryLimit(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	gcPercent := debug.SetGCPercent(100)
	defer debug.SetGCPercent(gcPercent)
	const none = 1<<63 - 1
	for _, tc := range []struct {
		name, gomemlimit string
		args             []string
		want             int64 // in force after
	}{
		{"default", "", nil, defaultMemoryLimit},
		{"flag", "", []string{"--memory-limit", "64MiB"}, 64 << 20},
		{"none", "", []string{"--memory-limit", "0"}, 0},
		{"GOMEMLIMIT wins", "100MiB", []string{"--memory-limit", "64MiB"}, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("GOMEMLIMIT", tc.gomemlimit)
			t.Setenv("GOGC", "")
			debug.SetGCPercent(100)
			const before = 123 << 20 // as if the runtime had read GOMEMLIMIT
			debug.SetMemoryLimit(before)
			if tc.want == 0 {
				debug.SetMemoryLimit(none)
			}
			var s settings
			if err := parse(newFlagSet("test", &s, &bytes.Buffer{}), &s, tc.args); err != nil {
				t.Fatal(err)
			}
			got := setRuntimeDefaults(int64(s.memoryLimit))
			want := tc.want
			if want == -1 {
				want = before // left as the runtime set it
			}
			if got != want || (want != 0 && debug.SetMemoryLimit(-1) != want) {
				t.Fatalf("memory limit %d (runtime %d), want %d", got, debug.SetMemoryLimit(-1), want)
			}
			if gc := debug.SetGCPercent(100); gc != 400 {
				t.Fatalf("GC target %d%%, want 400%% with GOGC empty", gc)
			}
		})
	}
}
