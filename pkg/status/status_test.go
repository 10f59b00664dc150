package status

import (
	"testing"

	"github.com/tendril-net/tendril/api/v1/ext"
)

func TestSectionsOrder(t *testing.T) {
	sec := func(title string, show bool) func() (ext.Section, bool) {
		return func() (ext.Section, bool) { return ext.Section{Title: title}, show }
	}
	got := Sections([]Contribution{
		{Order: 100, Section: sec("Identities", true)},
		{Order: 10, Section: sec("KVStore", true)},
		{Order: 80, Section: sec("Tables", false)},
		{Order: 20},
	})
	if len(got) != 2 || got[0].Title != "KVStore" || got[1].Title != "Identities" {
		t.Fatalf("sections = %+v, want KVStore then Identities", got)
	}
}
