"""What to cite: the papers of the built-in algorithms as BibTeX (each ``AlgorithmSpec`` names
its own in ``citation``; a plugin may set its own), fedbandit's own entry, and the short form
``fedbandit list --algorithms`` shows ("Huang et al., NeurIPS 2021").

Authors, titles, venues and years are those of the published papers; an algorithm that has no
paper of its own cites none (``greedy``, ``central_linucb``: textbook references run as
baselines) or the standard source of the rule it runs (``local_ucb``: the UCB index of Lattimore
and Szepesvari's book)."""

from __future__ import annotations

import re

from fedbandit._version import __version__

#: The published documentation of fedbandit (its own entry's address).
FEDBANDIT_URL = "https://fedbandit.readthedocs.io/"

FEDPE = """@inproceedings{huang2021federated,
  author    = {Huang, Ruiquan and Wu, Weiqiang and Yang, Jing and Shen, Cong},
  title     = {Federated Linear Contextual Bandits},
  booktitle = {Advances in Neural Information Processing Systems (NeurIPS)},
  volume    = {34},
  year      = {2021}
}"""

FEDPE_USER_LEVEL_DP = """@inproceedings{huang2023federated,
  author    = {Huang, Ruiquan and Zhang, Huanyu and Melis, Luca and Shen, Milan and
               Hejazinia, Meisam and Yang, Jing},
  title     = {Federated Linear Contextual Bandits with User-level Differential Privacy},
  booktitle = {Proceedings of the 40th International Conference on Machine Learning (ICML)},
  series    = {Proceedings of Machine Learning Research},
  volume    = {202},
  year      = {2023}
}"""

LINUCB_D = """@inproceedings{wu2020stochastic,
  author    = {Wu, Weiqiang and Yang, Jing and Shen, Cong},
  title     = {Stochastic Linear Contextual Bandits with Diverse Contexts},
  booktitle = {Proceedings of the 23rd International Conference on Artificial Intelligence and
               Statistics (AISTATS)},
  series    = {Proceedings of Machine Learning Research},
  volume    = {108},
  pages     = {2392--2401},
  year      = {2020}
}"""

LINUCB = """@inproceedings{li2010contextual,
  author    = {Li, Lihong and Chu, Wei and Langford, John and Schapire, Robert E.},
  title     = {A Contextual-Bandit Approach to Personalized News Article Recommendation},
  booktitle = {Proceedings of the 19th International Conference on World Wide Web (WWW)},
  pages     = {661--670},
  year      = {2010}
}"""

OFUL = """@inproceedings{abbasi2011improved,
  author    = {Abbasi-Yadkori, Yasin and P{\\'a}l, D{\\'a}vid and Szepesv{\\'a}ri, Csaba},
  title     = {Improved Algorithms for Linear Stochastic Bandits},
  booktitle = {Advances in Neural Information Processing Systems (NeurIPS)},
  volume    = {24},
  year      = {2011}
}"""

UCB_BOOK = """@book{lattimore2020bandit,
  author    = {Lattimore, Tor and Szepesv{\\'a}ri, Csaba},
  title     = {Bandit Algorithms},
  publisher = {Cambridge University Press},
  year      = {2020}
}"""

DISLINUCB = """@inproceedings{wang2020distributed,
  author    = {Wang, Yuanhao and Hu, Jiachen and Chen, Xiaoyu and Wang, Liwei},
  title     = {Distributed Bandit Learning: Near-Optimal Regret with Efficient Communication},
  booktitle = {International Conference on Learning Representations (ICLR)},
  year      = {2020}
}"""

ASYNC_LINUCB = """@inproceedings{li2022asynchronous,
  author    = {Li, Chuanhao and Wang, Hongning},
  title     = {Asynchronous Upper Confidence Bound Algorithms for Federated Linear Bandits},
  booktitle = {Proceedings of the 25th International Conference on Artificial Intelligence and
               Statistics (AISTATS)},
  series    = {Proceedings of Machine Learning Research},
  volume    = {151},
  year      = {2022}
}"""

FEDLINUCB = """@inproceedings{he2022simple,
  author    = {He, Jiafan and Wang, Tianhao and Min, Yifei and Gu, Quanquan},
  title     = {A Simple and Provably Efficient Algorithm for Asynchronous Federated Contextual
               Linear Bandits},
  booktitle = {Advances in Neural Information Processing Systems (NeurIPS)},
  volume    = {35},
  year      = {2022}
}"""

HLINUCB = """@inproceedings{do2023multi,
  author    = {Do, Anh and Nguyen-Tang, Thanh and Arora, Raman},
  title     = {Multi-Agent Learning with Heterogeneous Linear Contextual Bandits},
  booktitle = {Advances in Neural Information Processing Systems (NeurIPS)},
  volume    = {36},
  year      = {2023}
}"""

FEDGLB_UCB = """@inproceedings{li2022communication,
  author    = {Li, Chuanhao and Wang, Hongning},
  title     = {Communication Efficient Federated Learning for Generalized Linear Bandits},
  booktitle = {Advances in Neural Information Processing Systems (NeurIPS)},
  volume    = {35},
  year      = {2022}
}"""

ONS_GLM = """@inproceedings{jun2017scalable,
  author    = {Jun, Kwang-Sung and Bhargava, Aniruddha and Nowak, Robert and Willett, Rebecca},
  title     = {Scalable Generalized Linear Bandits: Online Computation and Hashing},
  booktitle = {Advances in Neural Information Processing Systems (NeurIPS)},
  volume    = {30},
  year      = {2017}
}"""

FEDIGW = """@article{shi2024harnessing,
  author    = {Shi, Chengshuai and Zhou, Ruida and Yang, Kun and Shen, Cong},
  title     = {Harnessing the Power of Federated Learning in Federated Contextual Bandits},
  journal   = {Transactions on Machine Learning Research (TMLR)},
  year      = {2024}
}"""

PRIVATE_FEDLINUCB = """@inproceedings{zhou2024differentially,
  author    = {Zhou, Xingyu and Chowdhury, Sayak Ray},
  title     = {On Differentially Private Federated Linear Contextual Bandits},
  booktitle = {International Conference on Learning Representations (ICLR)},
  year      = {2024}
}"""


def fedbandit_bibtex(version: str = __version__) -> str:
    """fedbandit's own entry (the software; the same as ``CITATION.cff``)."""
    return f"""@software{{fedbandit,
  author    = {{{{The fedbandit developers}}}},
  title     = {{fedbandit: simulate and run federated linear bandits}},
  version   = {{{version}}},
  license   = {{Apache-2.0}},
  url       = {{{FEDBANDIT_URL}}}
}}"""


_ENTRY_START = re.compile(r"@\w+\s*\{\s*([^,\s]+)\s*,")
_FIELD = r"\b{name}\s*=\s*\{{((?:[^{{}}]|\{{[^{{}}]*\}})*)\}}"
#: The venue as written in a booktitle or journal: its abbreviation in parentheses.
_VENUE = re.compile(r"\(([A-Za-z]+)\)\s*$")


def entry_keys(bibtex: str) -> list[str]:
    """The citation keys of the entries in ``bibtex``, in order."""
    return _ENTRY_START.findall(bibtex)


def _field(bibtex: str, name: str) -> str:
    match = re.search(_FIELD.format(name=name), bibtex, re.IGNORECASE)
    return " ".join(match.group(1).split()) if match else ""


def split_entries(bibtex: str) -> list[str]:
    """The entries of ``bibtex``, each from its ``@`` to the next (text before the first one,
    such as comments, is dropped)."""
    starts = [match.start() for match in _ENTRY_START.finditer(bibtex)]
    ends = [*starts[1:], len(bibtex)][: len(starts)]
    return [bibtex[start:end].strip() for start, end in zip(starts, ends, strict=True)]


def short_reference(bibtex: str) -> str:
    """The entries of ``bibtex`` in short form, separated by "; ": "Huang et al., NeurIPS 2021"
    (one author: surname; two: both; more: the first et al.); "" for none. A plugin's citation
    that is not BibTeX shows as its first line."""
    entries = split_entries(bibtex)
    if not entries:
        return bibtex.strip().split("\n")[0]
    return "; ".join(_short_entry(entry) for entry in entries)


def _short_entry(bibtex: str) -> str:
    """One entry in short form."""
    authors = [author.strip() for author in _field(bibtex, "author").split(" and ") if author]
    surnames = [re.sub(r"[{}\\']", "", author.split(",")[0]).strip() for author in authors]
    who = f"{surnames[0]} et al." if len(surnames) > 2 else " & ".join(surnames)
    venue_text = _field(bibtex, "booktitle") or _field(bibtex, "journal")
    venue_match = _VENUE.search(venue_text)
    venue = venue_match.group(1) if venue_match else _field(bibtex, "publisher")
    year = _field(bibtex, "year")
    return ", ".join(part for part in (who, " ".join(p for p in (venue, year) if p)) if part)
