package lockrank

import (
	"os"
	"testing"
)

// docOrder is doc.go's text, for TestOrderDocumented.
var docOrder string

func TestMain(m *testing.M) {
	b, err := os.ReadFile("doc.go")
	if err != nil {
		panic(err)
	}
	docOrder = string(b)
	os.Exit(m.Run())
}
