package regions

import (
	"context"
	"testing"
	"time"
)

// TestSyncRecord: a region's instances share one record: each adds its
// demand, one at a time renews the grant in a turn greater than any before
// (another takes over when its turn ends unanswered, or when it gives the
// turn up), and the renewer's answer is what all of them read until its
// lease ends; an answer out of turn is not written.
func TestSyncRecord(t *testing.T) {
	l, m := store(t)
	now := time.Unix(1_700_006_400, 0)
	m.SetTime(now)
	turns := map[string]uint64{} // each instance's last turn
	var last uint64
	sync := func(instance string, demand float64, set, release bool, grant uint64, lease time.Duration) recordState {
		t.Helper()
		s, err := syncRecord(context.Background(), l, recordSync{
			Key: "test:k_v:region", Instance: instance, Demand: demand, DemandTTL: time.Second,
			RenewAhead: time.Second, RenewTTL: 500 * time.Millisecond, Set: set, Turn: turns[instance], Release: release,
			Grant: grant, Lease: lease,
		})
		if err != nil {
			t.Fatal(err)
		}
		if s.Renew != (s.Turn != 0) || s.Renew && s.Turn <= last {
			t.Fatalf("renew %v in turn %d after turn %d", s.Renew, s.Turn, last)
		}
		if s.Renew {
			turns[instance], last = s.Turn, s.Turn
		}
		s.Turn = 0
		return s
	}
	steps := []struct {
		name         string
		advance      time.Duration
		instance     string
		demand       float64
		set, release bool
		grant        uint64
		lease        time.Duration
		want         recordState
	}{
		{"the first to see no grant renews", 0, "a", 10, false, false, 0, 0, recordState{Demand: 10, Renew: true}},
		{"another does not while it does", 0, "b", 5, false, false, 0, 0, recordState{Demand: 15}},
		{"the renewer gives its turn up", 10 * time.Millisecond, "a", 10, true, true, 0, 0, recordState{Demand: 15}},
		{"then the next to sync renews", 10 * time.Millisecond, "b", 5, false, false, 0, 0, recordState{Demand: 15, Renew: true}},
		{"the renewer writes the ledger's answer", 80 * time.Millisecond, "b", 5, true, false, 40, 3 * time.Second,
			recordState{Grant: 40, LeaseLeft: 3 * time.Second, Demand: 15}},
		{"the others read it", 100 * time.Millisecond, "a", 10, false, false, 0, 0, recordState{Grant: 40, LeaseLeft: 2900 * time.Millisecond, Demand: 15}},
		{"within a second of the lease's end, one renews", 2 * time.Second, "a", 10, false, false, 0, 0,
			recordState{Grant: 40, LeaseLeft: 900 * time.Millisecond, Demand: 10, Renew: true}}, // b's demand expired
		{"an answer from an ended turn is not written", 0, "b", 5, true, false, 99, 3 * time.Second,
			recordState{Grant: 40, LeaseLeft: 900 * time.Millisecond, Demand: 15}},
		{"its turn over, another takes it", 600 * time.Millisecond, "b", 5, false, false, 0, 0,
			recordState{Grant: 40, LeaseLeft: 300 * time.Millisecond, Demand: 15, Renew: true}},
		{"the one whose turn ended writes nothing", 0, "a", 10, true, false, 77, 3 * time.Second,
			recordState{Grant: 40, LeaseLeft: 300 * time.Millisecond, Demand: 15}},
		{"the lease ended: no grant", 400 * time.Millisecond, "a", 10, false, false, 0, 0, recordState{Demand: 15}},
		{"an instance's demand expires", 1100 * time.Millisecond, "b", 5, false, false, 0, 0, recordState{Demand: 5, Renew: true}},
	}
	for _, s := range steps {
		now = now.Add(s.advance)
		m.SetTime(now)
		if got := sync(s.instance, s.demand, s.set, s.release, s.grant, s.lease); got != s.want {
			t.Fatalf("%s: %+v, want %+v", s.name, got, s.want)
		}
	}
}
