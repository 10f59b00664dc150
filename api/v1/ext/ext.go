// Package ext holds Tendril's extensions to the Cilium v1 API models: fields
// that stock clients ignore and that Tendril's CLI reads (module health,
// bootstrap stats).
package ext

import (
	"time"

	"github.com/cilium/cilium/api/v1/models"
)

// StatusResponse is models.StatusResponse plus the "tendril" extension.
type StatusResponse struct {
	models.StatusResponse
	Tendril *Status `json:"tendril,omitempty"`
}

// Status is the agent's own view of itself.
type Status struct {
	Version   string         `json:"version"`
	Started   time.Time      `json:"started"`
	NodeName  string         `json:"node-name,omitempty"`
	Modules   []ModuleHealth `json:"modules"`
	Bootstrap Bootstrap      `json:"bootstrap"`
	// Sections are extra status lines by subsystem (datapath, ipam,
	// kubernetes...), each a list of key/value lines for `tendril status`.
	Sections []Section `json:"sections,omitempty"`
}

// ModuleHealth is one module's health.
type ModuleHealth struct {
	Module  string    `json:"module"`
	Level   string    `json:"level"`
	Message string    `json:"message,omitempty"`
	Since   time.Time `json:"since"`
}

// Bootstrap is how long the agent's start took, step by step.
type Bootstrap struct {
	Total time.Duration `json:"total"`
	Steps []Step        `json:"steps"`
}

// Step is one start step.
type Step struct {
	Name     string        `json:"name"`
	Duration time.Duration `json:"duration"`
	Error    string        `json:"error,omitempty"`
}

// Section is a titled group of status lines.
type Section struct {
	Title string `json:"title"`
	Lines []Line `json:"lines"`
}

// Line is one key/value status line.
type Line struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// TraceRequest is the body of POST /v1/policy/trace (a Tendril extension:
// the v1 spec has no trace path); the server and the CLI share it.
type TraceRequest struct {
	Src   []string `json:"src"`
	Dst   []string `json:"dst"`
	Proto string   `json:"protocol"`
	Port  uint16   `json:"dport"`
}
