package main

import (
	"fmt"
	"net/url"
	"strings"
)

// serviceMap resolves the Services named in GPUSLICE_SERVICE_MAP to loopback addresses. The test
// control plane has no kube-proxy and no DNS, and loopback addresses cannot be endpoints, so the
// API server reaches a webhook's Service through this map; the manifests stay as shipped.
type serviceMap map[string]string

func parseServiceMap(spec string) (serviceMap, error) {
	services := serviceMap{}
	for _, entry := range strings.Split(spec, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		service, address, found := strings.Cut(entry, "=")
		if !found || strings.Count(service, "/") != 1 || !strings.Contains(address, ":") {
			return nil, fmt.Errorf("entry %q is not NAMESPACE/NAME=HOST:PORT", entry)
		}
		services[service] = address
	}
	return services, nil
}

func (services serviceMap) ResolveEndpoint(namespace, name string, port int32) (*url.URL, error) {
	address, found := services[namespace+"/"+name]
	if !found {
		return nil, fmt.Errorf("service %s/%s is not in GPUSLICE_SERVICE_MAP", namespace, name)
	}
	return &url.URL{Scheme: "https", Host: address}, nil
}

func parseURLs(raw ...string) ([]url.URL, error) {
	parsed := make([]url.URL, 0, len(raw))
	for _, text := range raw {
		value, err := url.Parse(text)
		if err != nil {
			return nil, fmt.Errorf("%q is not a URL: %w", text, err)
		}
		parsed = append(parsed, *value)
	}
	return parsed, nil
}
