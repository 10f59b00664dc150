package l7proxy

import (
	"net/http/httptest"
	"testing"

	"github.com/tendril-net/tendril/pkg/policy/api"
)

func TestHTTPRuleMatches(t *testing.T) {
	m, err := Compile(api.PortRuleHTTP{Method: "GET|HEAD", Path: "/api/.*", Host: "world\\.example", Headers: []string{"x-token: abc", "X-Trace"}})
	if err != nil {
		t.Fatal(err)
	}
	req := func(method, url string, hdr ...string) bool {
		r := httptest.NewRequest(method, url, nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Header.Add(hdr[i], hdr[i+1])
		}
		return m.Matches(r)
	}
	if !req("GET", "http://world.example:8080/api/v1", "X-Token", "abc", "X-Trace", "1") {
		t.Error("matching request denied")
	}
	for name, ok := range map[string]bool{
		"method":        req("POST", "http://world.example/api/v1", "X-Token", "abc", "X-Trace", "1"),
		"method prefix": req("GETX", "http://world.example/api/v1", "X-Token", "abc", "X-Trace", "1"),
		"path anchored": req("GET", "http://world.example/x/api/v1", "X-Token", "abc", "X-Trace", "1"),
		"host":          req("GET", "http://other.example/api/v1", "X-Token", "abc", "X-Trace", "1"),
		"header value":  req("GET", "http://world.example/api/v1", "X-Token", "abd", "X-Trace", "1"),
		"header absent": req("GET", "http://world.example/api/v1", "X-Token", "abc"),
	} {
		if ok {
			t.Errorf("%s: non-matching request allowed", name)
		}
	}
	empty, _ := Compile(api.PortRuleHTTP{})
	if !empty.Matches(httptest.NewRequest("DELETE", "/any", nil)) {
		t.Error("an empty rule allows every request")
	}
}
