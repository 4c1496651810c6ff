package settings

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/slidingwindow/ratelimit/internal/redisstore"
)

// singleURL is the go-redis URL of REDIS_TYPE=SINGLE: REDIS_URL is a
// host:port (tcp), a socket path (unix), or already a redis:// or rediss://
// URL, which REDIS_AUTH completes when it has no credentials.
func singleURL(raw, socket, auth string, tlsOn bool) (string, error) {
	if strings.HasPrefix(raw, "redis://") || strings.HasPrefix(raw, "rediss://") || strings.HasPrefix(raw, "unix://") {
		u, err := url.Parse(raw)
		if err != nil {
			return "", fmt.Errorf("%q is not a valid URL", redisstore.RedactURL(raw))
		}
		if tlsOn && u.Scheme == "redis" {
			u.Scheme = "rediss"
		}
		if u.User == nil && auth != "" {
			u.User = userinfo(auth)
		}
		return u.String(), nil
	}
	if socket == "unix" || socket == "" && strings.HasPrefix(raw, "/") {
		if tlsOn {
			return "", errors.New("TLS is on (REDIS_TLS or REDIS_PERSECOND_TLS) with a Unix socket")
		}
		path, err := filepath.Abs(raw) // relative to the working directory, as a dial takes it
		if err != nil {
			return "", err
		}
		u := url.URL{Scheme: "unix", Path: path}
		if auth != "" {
			u.User = userinfo(auth)
		}
		return u.String(), nil
	}
	return listURL([]string{raw}, redisScheme(tlsOn), auth, "")
}

// redisScheme is go-redis's URL scheme, rediss with TLS on.
func redisScheme(tlsOn bool) string {
	if tlsOn {
		return "rediss"
	}
	return "redis"
}

// listURL is a go-redis URL naming addrs (host:port each): the first as the
// URL's host, the others as addr parameters; master names a Sentinel
// master.
func listURL(addrs []string, scheme, auth, master string) (string, error) {
	for _, a := range addrs {
		host, port, err := net.SplitHostPort(strings.TrimSpace(a))
		if err != nil || host == "" || strings.Contains(host, "@") {
			return "", fmt.Errorf("%q is not host:port (credentials go in REDIS_AUTH)", shownAddr(a))
		}
		if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
			return "", fmt.Errorf("%q: the port is not a number from 1 to 65535", shownAddr(a))
		}
	}
	u := url.URL{Scheme: scheme, Host: strings.TrimSpace(addrs[0])}
	if auth != "" {
		u.User = userinfo(auth)
	}
	q := url.Values{}
	for _, a := range addrs[1:] {
		q.Add("addr", strings.TrimSpace(a))
	}
	if master != "" {
		q.Set("master_name", master)
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// shownAddr is an address fit for an error message: a URL's password
// hidden (redisstore.RedactURL), and without a scheme, whatever precedes an '@'
// (user:password@host:port).
func shownAddr(a string) string {
	if strings.Contains(a, "://") {
		return redisstore.RedactURL(a)
	}
	if at := strings.LastIndexByte(a, '@'); at >= 0 {
		return "xxxxx" + a[at:]
	}
	return a
}

// splitAuth reads REDIS_AUTH as the reference does: user:password, or a
// password alone.
func splitAuth(auth string) (user, pass string) {
	if u, p, ok := strings.Cut(auth, ":"); ok {
		return u, p
	}
	return "", auth
}

func userinfo(auth string) *url.Userinfo {
	return url.UserPassword(splitAuth(auth))
}
