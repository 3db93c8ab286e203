# promptscale at paper scale, included by paper.smk: the code domain's seeds: Codeforces statements annotated with concepts and rationales by instruct models (spec 2.2).
