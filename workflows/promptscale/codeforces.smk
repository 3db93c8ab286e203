# promptscale at paper scale, included by paper.smk: Codeforces Elo, CodeElo-style: the policies' submissions for CodeElo's contest problems and the rating from the judge's verdicts (spec 8).
