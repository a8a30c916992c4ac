"""One module per provider kind; importing it registers its adapter (`receipts.inbound.adapter`).

Every module of this package is imported here (at app start-up, `receipts.apps`), so adding a
vendor is adding its module.
"""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
