package observer

import (
	"fmt"
	"net/url"
	"regexp"
	"strings"

	flowpb "github.com/cilium/cilium/api/v1/flow"
)

// The L7 filters select the proxies' flows (DNS and HTTP records) with
// the semantics of hubble observe's --http-status, --http-method,
// --http-path, --http-url and --dns-query. A flow without the record a
// field asks about never matches it.

// httpStatusFilter matches the HTTP record's code: a value is a full code
// ("404") or a prefix of its three digits followed by "+" ("5+" is every
// 5xx, "40+" 400 to 409). A record without a code (0) matches nothing.
func httpStatusFilter(values []string) (FilterFunc, error) {
	if len(values) == 0 {
		return nil, nil
	}
	var exact, prefixes []string
	for _, v := range values {
		digits, plus := strings.CutSuffix(v, "+")
		valid := digits != "" && digits[0] >= '1' && digits[0] <= '5' &&
			strings.Trim(digits, "0123456789") == "" && ((plus && len(digits) <= 2) || (!plus && len(digits) == 3))
		if !valid {
			return nil, fmt.Errorf("http_status_code %q: want a code from 100 to 599, or its first one or two digits followed by + (\"5+\")", v)
		}
		if plus {
			prefixes = append(prefixes, digits)
		} else {
			exact = append(exact, digits)
		}
	}
	return func(f *flowpb.Flow) bool {
		code := f.GetL7().GetHttp().GetCode()
		if code == 0 {
			return false
		}
		s := fmt.Sprintf("%03d", code)
		for _, e := range exact {
			if s == e {
				return true
			}
		}
		for _, p := range prefixes {
			if strings.HasPrefix(s, p) {
				return true
			}
		}
		return false
	}, nil
}

// httpMethodFilter matches the HTTP record's method, without case.
func httpMethodFilter(values []string) (FilterFunc, error) {
	if len(values) == 0 {
		return nil, nil
	}
	for _, v := range values {
		if v == "" {
			return nil, fmt.Errorf("http_method: an empty method")
		}
	}
	return func(f *flowpb.Flow) bool {
		h := f.GetL7().GetHttp()
		if h == nil || h.GetMethod() == "" {
			return false
		}
		for _, v := range values {
			if strings.EqualFold(v, h.GetMethod()) {
				return true
			}
		}
		return false
	}, nil
}

// compileRegexps compiles a field's regular expressions (Go syntax,
// unanchored, as hubble's).
func compileRegexps(field string, values []string) ([]*regexp.Regexp, error) {
	out := make([]*regexp.Regexp, 0, len(values))
	for _, v := range values {
		re, err := regexp.Compile(v)
		if err != nil {
			return nil, fmt.Errorf("%s %q: %w", field, v, err)
		}
		out = append(out, re)
	}
	return out, nil
}

func anyMatch(res []*regexp.Regexp, s string) bool {
	for _, re := range res {
		if re.MatchString(s) {
			return true
		}
	}
	return false
}

// httpPathFilter matches regular expressions against the path of the HTTP
// record's URL.
func httpPathFilter(values []string) (FilterFunc, error) {
	if len(values) == 0 {
		return nil, nil
	}
	res, err := compileRegexps("http_path", values)
	if err != nil {
		return nil, err
	}
	return func(f *flowpb.Flow) bool {
		h := f.GetL7().GetHttp()
		if h == nil {
			return false
		}
		u, err := url.Parse(h.GetUrl())
		if err != nil {
			return false
		}
		return anyMatch(res, u.Path)
	}, nil
}

// httpURLFilter matches regular expressions against the HTTP record's
// whole URL.
func httpURLFilter(values []string) (FilterFunc, error) {
	if len(values) == 0 {
		return nil, nil
	}
	res, err := compileRegexps("http_url", values)
	if err != nil {
		return nil, err
	}
	return func(f *flowpb.Flow) bool {
		h := f.GetL7().GetHttp()
		return h != nil && anyMatch(res, h.GetUrl())
	}, nil
}

// dnsQueryFilter matches regular expressions against the DNS record's
// query, as the proxy saw it (with its trailing dot).
func dnsQueryFilter(values []string) (FilterFunc, error) {
	if len(values) == 0 {
		return nil, nil
	}
	res, err := compileRegexps("dns_query", values)
	if err != nil {
		return nil, err
	}
	return func(f *flowpb.Flow) bool {
		d := f.GetL7().GetDns()
		return d != nil && anyMatch(res, d.GetQuery())
	}, nil
}
