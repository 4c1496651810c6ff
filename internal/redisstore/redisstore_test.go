package redisstore

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

func TestRedactURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"redis://r:6379/0", "redis://r:6379/0"},
		{"redis://user:hunter22@r:6379", "redis://user:xxxxx@r:6379"},
		{"rediss://:hunter22@r:6379", "rediss://:xxxxx@r:6379"},
		{"redis://hunter22@r:6379", "redis://xxxxx@r:6379"},
		{"redis://u:hun/ter@22@r:6379", "redis://u:xxxxx@r:6379"}, // malformed: '/' and '@' in the password
		{"redis://u:hun?ter22@r:6379", "redis://u:xxxxx@r:6379"},  // '?' in the password
		{"unix://u:hunter22@/run/redis.sock", "unix://u:xxxxx@/run/redis.sock"},
		{"redis://s:6379?master_name=m&password=hunter22&username=u", "redis://s:6379?master_name=m&password=xxxxx&username=u"},
		{"redis://:p@s:1?sentinel_password=hunter22", "redis://:xxxxx@s:1?sentinel_password=xxxxx"},
		{"r:6379", "r:6379"},
	} {
		if got := RedactURL(tc.in); got != tc.want {
			t.Errorf("RedactURL(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestMalformedURLHidesPassword: whatever part of a URL does not parse, the
// error does not show its password.
func TestMalformedURLHidesPassword(t *testing.T) {
	for _, cfg := range []Config{
		{URL: "redis://user:hunter22@r:63x79"},
		{URL: "redis://user:hun/ter22@r:6379"},
		{URL: "redis://:hunter22@r:6379/x"},
		{URL: "redis://:hunter22@r:6379%zz"},
		{URL: "http://:hunter22@r:6379"},
		{ClusterURL: "redis://:hunter22@a:x1"},
		{SentinelURL: "redis://:hunter22@s:1/x?master_name=m"},
		{SentinelURL: "redis://s:1?master_name=m&password=hunter22&db=x"},
	} {
		s, err := Open(cfg)
		if err == nil {
			_ = s.Close() // the open that should have failed is what is reported
			t.Errorf("%+v: no error", cfg)
			continue
		}
		if strings.Contains(err.Error(), "hunter22") || strings.Contains(err.Error(), "ter22") {
			t.Errorf("%+v: error shows the password: %v", cfg, err)
		}
	}
}

func TestAuthRefused(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{errors.New("WRONGPASS invalid username-password pair"), false}, // not a Redis reply
		{fmt.Errorf("%w: prepare: %w", errors.New("rate limit store"), errors.Join(redisErr("WRONGPASS invalid username-password pair or user is disabled."))), true},
		{redisErr("NOAUTH Authentication required."), true},
		{redisErr("ERR AUTH <password> called without any password configured for the default user."), true},
		{redisErr("ERR unknown command"), false},
		{redisErr("LOADING Redis is loading the dataset in memory"), false},
	} {
		if got := AuthRefused(tc.err); got != tc.want {
			t.Errorf("AuthRefused(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// redisErr is a reply error as go-redis returns it.
type redisErr string

func (e redisErr) Error() string { return string(e) }
func (redisErr) RedisError()     {}

var _ redis.Error = redisErr("")
