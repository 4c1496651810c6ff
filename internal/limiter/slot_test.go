package limiter

import "testing"

func TestKeySlot(t *testing.T) {
	cases := []struct {
		key  string
		slot int
	}{
		// CRC16 check value from the Redis Cluster specification: 0x31C3.
		{"123456789", 0x31C3},
		// CLUSTER KEYSLOT answers from a real Redis 7.0 cluster.
		{"foo", 12182},
		{"bar", 5061},
		{"{user1000}.following", 3443},
		{"{user1000}.followers", 3443},
		{"foo{}{bar}", 8363},    // empty first tag: the whole key is hashed
		{"foo{{bar}}zap", 4015}, // the tag is "{bar"
		{"rl:{e2e|log=a}:log:60", keySlot("e2e|log=a")},
	}
	for _, tc := range cases {
		if got := keySlot(tc.key); got != tc.slot {
			t.Errorf("keySlot(%q) = %d, want %d", tc.key, got, tc.slot)
		}
	}
}
