package loadgen

import (
	"math/rand/v2"
	"strings"
)

// words are short, common English words: most BPE vocabularies hold each,
// with its leading space, as one token, so n of them make a prompt of
// roughly n tokens.
var words = strings.Fields(`
the of and to in is was that for on with as by at from it be this are or
have not but had his they were which one you all she there would their we
him been has when who will more no if out so said what up its about into
than them can only other new some could time these two may then do first
any my now such like our over man me even most made after also did many
before must through back years where much your way well down should because
each just those people how too little state good very make world still own
see men work long get here between both life being under never day same
another know while last might us great old year off come since against go
came right used take three states himself few house use during without
again place around however home small found thought went say part once
general high upon school every give room often city water light hand early
open tree river green stone bread field road night bird ship book door
fire wind rain snow sea hill town king song letter table window garden
paper story friend mother father child horse summer winter morning evening
`)

// prompt builds a prompt of n words drawn from words.
func prompt(r randSource, n int) string {
	var b strings.Builder
	b.Grow(n * 6)
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[r.IntN(len(words))])
	}
	return b.String()
}

// randSource is the part of *rand.Rand prompt needs.
type randSource interface{ IntN(int) int }

var _ randSource = (*rand.Rand)(nil)
